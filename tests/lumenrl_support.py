"""LumenRL's published configs held as facts, and a stand-in LumenRL checkout for the tests.

The facts are the values of LumenRL's ``examples/GRPO/configs/grpo_dsv4_flash_vllm_longrun.yaml`` at commit
2232f554ec55 (branch dev/dsv4-grpo; the version whose rollout precision is fp8, rollout_is_batch_normalize false,
val_steps 5 and save_steps 25 -- an older stored version, 67ad105, differs in those) and of
``grpo_dsv4_flash_vllm_smoke.yaml`` at b039ba2966b7 (the version LumenRL's own config test loads), read key by key in
LumenRL's repository. LUMENRL_DEFAULTS are LumenRL's dataclass defaults (lumenrl/core/config.py @2232f554) for keys
the recipe writes that a file leaves out.

The stand-in checkout (``make_standin_checkout``) is NOT LumenRL: a folder laid out like a Lumen-RL checkout whose
``lumenrl/trainer/main.py`` is tests/standins/lumenrl_trainer_main.py and whose published config is built from the
facts below. It lets tests run repro's side of the seam end to end on a CPU.
"""

import shutil
import signal
from pathlib import Path

import yaml

STANDIN_MAIN = Path(__file__).parent / "standins" / "lumenrl_trainer_main.py"
LONGRUN_FILE = "examples/GRPO/configs/grpo_dsv4_flash_vllm_longrun.yaml"

_WEIGHT_SYNC = {"weight_sync.enabled": True, "weight_sync.backend": "rdma", "weight_sync.bucket_size_mb": 2048,
                "weight_sync.verify_full_load": True, "weight_sync.fp8_quantization_location": "inference",
                "weight_sync.rdma.backend": "rccl", "weight_sync.rdma.require_rdma": True,
                "weight_sync.rdma.gdr_mode": "auto"}
_CONTROLLER = {"controller.ray.enabled": True, "controller.ray.fuse_actor_ref": False,
               "controller.ray.actor.num_workers": 16, "controller.ray.actor.dispatch_mode": "dp_compute_proto",
               "controller.ray.actor.process_on_nodes": [8, 8], "controller.ray.rollout.num_workers": 8,
               "controller.ray.rollout.process_on_nodes": [8]}
_MEGATRON = {f"policy.training.megatron_cfg.{k}": v for k, v in {
    "tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 4, "expert_model_parallel_size": 4,
    "expert_tensor_parallel_size": 1, "num_experts": 256, "num_layers_in_first_pipeline_stage": 11,
    "num_layers_in_last_pipeline_stage": 10, "moe_grouped_gemm": True, "moe_token_dispatcher_type": "alltoall",
    "use_distributed_optimizer": True, "attention_softmax_in_fp32": True, "sequence_parallel": True,
    "recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1,
    "attention_backend": "flash", "use_packed_sequences": True, "log_probs_chunk_size": 1024, "numa_affinity": True,
    "optimizer_cpu_offload": True, "optimizer_offload_fraction": 1.0}.items()}
_FSDP = {"policy.training.fsdp_cfg.param_offload": False, "policy.training.fsdp_cfg.optimizer_offload": False,
         "policy.training.fsdp_cfg.reshard_after_forward": True}
_VLLM = {f"policy.generation.vllm_cfg.{k}": v for k, v in {
    "transport": "ray_http", "ray_http_start_server": True, "tensor_parallel_size": 8, "quantization": "fp8_per_block",
    "enforce_eager": True, "disable_custom_all_reduce": True, "kv_cache_dtype": "fp8_e4m3",
    "gpu_memory_utilization": 0.92, "dtype": "bfloat16", "enable_chunked_prefill": True,
    "max_num_batched_tokens": 8192, "calculate_log_probs": True, "enable_sleep_mode": False, "sleep_level": 0,
    "update_weights_bucket_megabytes": 2048, "temperature": 0.8, "top_p": 1.0, "top_k": -1}.items()}
_ALGORITHM = {"algorithm.name": "grpo", "algorithm.adv_estimator": "grpo", "algorithm.use_kl_in_reward": False,
              "algorithm.loss_agg_mode": "seq-mean-token-mean", "algorithm.clip_ratio_high": 0.28,
              "algorithm.grpo.num_generations": 8, "algorithm.grpo.kl_coeff": 0.0, "algorithm.grpo.clip_ratio": 0.2}
_COMMON = {"cluster.num_nodes": 3, "cluster.gpus_per_node": 8, "cluster.ray_address": "auto",
           "policy.training_backend": "megatron_lumen_dsv4", "policy.generation_backend": "vllm",
           "policy.train_micro_batch_size": 1, "policy.learning_rate": 1.0e-6, "policy.lr_warmup_steps": 0,
           "policy.weight_decay": 0.1, "policy.max_grad_norm": 1.0, "policy.lr_decay_style": "constant",
           "policy.adam_beta1": 0.9, "policy.adam_beta2": 0.98, "quantization.training.fp8": None,
           "quantization.rollout_correction.rollout_is_threshold": 2.0,
           "quantization.rollout_correction.rollout_is_batch_normalize": False, "moe.r3.enabled": True,
           "moe.r3.record_router_logits": False, "moe.r3.replay_mode": "hard_assignment", "reward.type": "function",
           "reward.function": "lumenrl.rewards.math_reward.dapo_math_reward",
           "reward.dataset": "/dev/shm/datasets/dapo-math-17k/dapo-math-17k.jsonl", "reward.shuffle": True,
           "reward.shuffle_seed": 10086, "val_dataset": "/dev/shm/datasets/aime-2024/aime-2024.jsonl",
           "val_batch_size": 0, "eval.num_samples": 0, "logger.log_interval": 1, "seed": 10086,
           **_WEIGHT_SYNC, **_CONTROLLER, **_MEGATRON, **_FSDP, **_VLLM, **_ALGORITHM}

LONGRUN_2232F554 = {
    **_COMMON,
    "weight_sync.shared_folder": "/dev/shm/weight_sync/dsv4-flash", "weight_sync.timeout_s": 7200,
    "weight_sync.rdma.hca": "ionic_0", "weight_sync.rdma.interface": "ens50f0", "weight_sync.rdma.gid_index": 1,
    "controller.ray.actor.topology_tags.node_ips": "10.235.200.172,10.235.200.57",
    "controller.ray.rollout.topology_tags.node_ips": "10.235.200.32",
    "policy.model_name": "/dev/shm/models/DeepSeek-V4-Flash-BF16", "policy.max_total_sequence_length": 16384,
    "policy.max_response_length": 4096, "policy.train_global_batch_size": 256, "policy.gen_batch_size": 32,
    "policy.max_token_len_per_gpu": 8192, "policy.balance_batch": True, "policy.optimizer_type": "adam",
    "policy.training.optimizer_dtype": "bf16",
    "policy.training.megatron_cfg.grad_reduce_in_fp32": True,
    "policy.training.megatron_cfg.use_precision_aware_optimizer": True,
    "policy.training.megatron_cfg.streamed_optimizer_mode": "adam",
    "policy.training.megatron_cfg.streamed_optimizer_chunk_size_mib": 256,
    "policy.training.megatron_cfg.streamed_optimizer_moment_dtype": "bf16",
    "policy.generation.vllm_cfg.moe_backend": "auto", "policy.generation.vllm_cfg.linear_backend": "auto",
    "policy.generation.vllm_cfg.max_model_len": 16384, "policy.generation.vllm_cfg.enable_prefix_caching": False,
    "policy.generation.vllm_cfg.max_num_seqs": 48,
    "quantization.rollout.precision": "fp8", "quantization.rollout_correction.rollout_is": "token",
    "val_steps": 5, "eval.enabled": True, "eval.num_generations": 8, "eval.temperature": 0.8, "eval.top_p": 0.7,
    "eval.top_k": -1,
    "checkpointing.checkpoint_dir": "/dev/shm/checkpoints/dsv4-flash/longrun", "checkpointing.save_steps": 25,
    "checkpointing.save_total_limit": 2, "checkpointing.resume": True,
    "logger.wandb_enabled": True, "logger.wandb.project": "LumenRL", "logger.wandb.entity": "danyzhan-amd",
    "logger.wandb.name": "dsv4-flash-grpo-vllm-200step-is-r3",
    "num_training_steps": 200,
}

SMOKE_B039BA2 = {
    **_COMMON,
    "weight_sync.shared_folder": "/volumes/oss1/lumenrl_weight_sync/dsv4-flash", "weight_sync.timeout_s": 1200,
    "weight_sync.rdma.hca": "mlx5_0", "weight_sync.rdma.interface": "ens14np0", "weight_sync.rdma.gid_index": 3,
    "controller.ray.rollout.topology_tags.node_ip": "10.194.132.76",
    "policy.model_name": "/root/models/DeepSeek-V4-Flash-BF16", "policy.max_total_sequence_length": 512,
    "policy.max_response_length": 256, "policy.train_global_batch_size": 8, "policy.gen_batch_size": 8,
    "policy.max_token_len_per_gpu": 512, "policy.optimizer_type": "sgd", "policy.sgd_momentum": 0.0,
    "policy.training.optimizer_dtype": "fp32",
    "policy.training.megatron_cfg.grad_reduce_in_fp32": False,
    "policy.training.megatron_cfg.v4_indexer_block_n": 64, "policy.training.megatron_cfg.v4_indexer_num_stages": 1,
    "policy.generation.vllm_cfg.max_model_len": 512, "policy.generation.vllm_cfg.max_num_seqs": 32,
    "quantization.rollout.precision": "bf16", "quantization.rollout_correction.rollout_is": None,
    "val_steps": 0, "eval.enabled": False,
    "checkpointing.checkpoint_dir": "/root/ckpts/dsv4-flash/smoke", "checkpointing.save_steps": 9999,
    "checkpointing.save_total_limit": 1, "checkpointing.resume": False, "logger.wandb_enabled": False,
    "num_training_steps": 3,
}

LUMENRL_DEFAULTS = {"policy.adam_eps": 1e-8,  # PolicyConfig.adam_eps, not set in either file
                    # MegatronConfig (core/config.py:201, 205), not set in the smoke file
                    "policy.training.megatron_cfg.streamed_optimizer_mode": "off",
                    "policy.training.megatron_cfg.streamed_optimizer_moment_dtype": "fp32"}


def nested(flat: dict) -> dict:
    out: dict = {}
    for dotted, value in flat.items():
        *sections, leaf = dotted.split(".")
        node = out
        for key in sections:
            node = node.setdefault(key, {})
        node[leaf] = value
    return out


def make_standin_checkout(root: Path) -> Path:
    """``root/Lumen-RL``: the stand-in entry module and the longrun config (built from the facts)."""
    checkout = root / "Lumen-RL"
    package = checkout / "lumenrl" / "trainer"
    package.mkdir(parents=True)
    (checkout / "lumenrl" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    shutil.copyfile(STANDIN_MAIN, package / "main.py")
    config = checkout / LONGRUN_FILE
    config.parent.mkdir(parents=True)
    config.write_text(yaml.safe_dump(nested(LONGRUN_2232F554), sort_keys=False))
    return checkout


def standin_overrides(checkout: Path, inputs: Path, steps: int, save_every: int, eval_every: int) -> list[str]:
    """The AMD recipe pointed at the stand-in checkout and at small local files (model folder, data)."""
    model, train, held_out = inputs / "model", inputs / "dapo.jsonl", inputs / "aime.jsonl"
    model.mkdir(parents=True, exist_ok=True)
    for path in (train, held_out):
        path.write_text('{"prompt": "1+1=?", "reward_model": {"ground_truth": "2"}}\n')
    return ["engine=lumenrl", f"lumenrl.path={checkout}", f"model.path={model}", f"data.train.path={train}",
            f"data.eval.path={held_out}", f"steps={steps}",
            f"checkpoint.every_steps={save_every}", f"eval.every_steps={eval_every}"]


def sigint_ignored(pid: int) -> bool:
    """Whether process ``pid`` ignores SIGINT: bit SIGINT-1 of the SigIgn mask in /proc/<pid>/status (Linux)."""
    with open(f"/proc/{pid}/status") as status:
        mask = next(line.split()[1] for line in status if line.startswith("SigIgn:"))
    return bool(int(mask, 16) >> (signal.SIGINT - 1) & 1)
