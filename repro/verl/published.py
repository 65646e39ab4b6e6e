"""verl's published DeepSeek-V4-Flash GRPO script as facts: the overrides
``examples/grpo_trainer/run_deepseek_v4_flash_megatron.sh`` passes to ``verl.trainer.main_ppo`` with its defaults
(verl-project/verl at df9e224, 2026-08-14, its last change in the snapshot read, of 2026-08-22; NVIDIA, Megatron +
vLLM, "8 nodes x 8 GPUs" by its variables, 11 by its header). Values are the script's; ``$``-placeholders stand
for its paths. The dry run sets ours beside these; tests/verl composes both with verl's own config (the script's
do not compose on 0.9.1: ``actor.megatron.grad_offload`` is no longer a key there, its offload folded into
``param_offload``).
"""

from __future__ import annotations

SCRIPT = "examples/grpo_trainer/run_deepseek_v4_flash_megatron.sh"
COMMIT = "df9e224339f08da7c88e3676f3a8f876f93eb1e2"
GONE_IN_0_9_1 = ("actor_rollout_ref.actor.megatron.grad_offload",)

_A = "actor_rollout_ref.actor."
_M = _A + "megatron."
_T = "++" + _M + "override_transformer_config."
_R = "actor_rollout_ref.rollout."
PUBLISHED: dict[str, str] = {
    "algorithm.adv_estimator": "grpo",
    "data.train_files": "$DATA_ROOT/dataset/BytedTsinghua-SIA/DAPO-Math-17k/data/dapo-math-17k.parquet",
    "data.val_files": "$DATA_ROOT/dataset/aime25_test.parquet", "data.train_batch_size": "8",
    "data.prompt_key": "prompt", "data.return_raw_chat": "True", "data.max_prompt_length": "2048",
    "data.max_response_length": "10240", "data.filter_overlong_prompts": "False", "data.truncation": "left",
    "data.dataloader_num_workers": "8", "+data.apply_chat_template_kwargs.enable_thinking": "True",
    "actor_rollout_ref.model.path": "$HDFS_ROOT/model/DeepSeek-V4-Flash",
    "actor_rollout_ref.model.trust_remote_code": "True", "actor_rollout_ref.model.use_fused_kernels": "True",
    "actor_rollout_ref.model.use_remove_padding": "True",
    "actor_rollout_ref.model.enable_gradient_checkpointing": "True",
    _A + "optim.lr": "1e-6", "+" + _A + "optim.override_optimizer_config.optimizer_offload_fraction": "1.0",
    "+" + _A + "optim.override_optimizer_config.overlap_cpu_optimizer_d2h_h2d": "True",
    "+" + _A + "optim.override_optimizer_config.optimizer_cpu_offload": "True",
    _A + "ppo_mini_batch_size": "8", _A + "ppo_micro_batch_size_per_gpu": "1", _A + "use_dynamic_bsz": "True",
    _A + "ppo_max_token_len_per_gpu": "12288",
    _M + "tensor_model_parallel_size": "1", _M + "pipeline_model_parallel_size": "8",
    _M + "virtual_pipeline_model_parallel_size": "null", _M + "expert_model_parallel_size": "8",
    _M + "expert_tensor_parallel_size": "1", _M + "context_parallel_size": "1", _M + "param_offload": "True",
    _M + "optimizer_offload": "True", _M + "grad_offload": "True", _M + "router_replay.mode": "R3",
    _T + "apply_dsa_kernel_fusion": "True", _T + "dsa_indexer_use_sparse_loss": "True",
    _T + "dsa_indexer_loss_coeff": "0.0", _T + "recompute_method": "uniform", _T + "recompute_granularity": "full",
    _T + "recompute_num_layers": "1", _T + "use_fused_mhc": "False",
    _T + "pipeline_model_parallel_layout": "'Et*6|t*6|t*6|t*5|t*5|t*5|t*5|t*5L'",
    _R + "name": "vllm", _R + "tensor_model_parallel_size": "1", _R + "data_parallel_size": "4",
    _R + "expert_parallel_size": "4", _R + "gpu_memory_utilization": "0.50", _R + "n": "8",
    _R + "calculate_log_probs": "True", _R + "enable_rollout_routing_replay": "True",
    _R + "log_prob_use_dynamic_bsz": "True", _R + "log_prob_max_token_len_per_gpu": "12288",
    _R + "log_prob_micro_batch_size_per_gpu": "1", _R + "max_num_seqs": "1", _R + "max_num_batched_tokens": "12288",
    _R + "max_model_len": "12288", _R + "checkpoint_engine.update_weights_bucket_megabytes": "512",
    "+" + _R + "engine_kwargs.vllm.kv_cache_dtype": "fp8",
    "reward.reward_manager.name": "dapo", "+reward.reward_kwargs.overlong_buffer_cfg.enable": "False",
    "+reward.reward_kwargs.overlong_buffer_cfg.len": "10240",
    "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor": "1.0",
    "+reward.reward_kwargs.overlong_buffer_cfg.log": "False", "+reward.reward_kwargs.max_resp_len": "10240",
    "trainer.logger": "[console,wandb]", "trainer.project_name": "wuxibin_dapo",
    "trainer.experiment_name": "deepseek_v4_flash_grpo_vllm_megatron", "trainer.n_gpus_per_node": "8",
    "trainer.nnodes": "8", "trainer.save_freq": "-1", "trainer.test_freq": "-1", "trainer.total_epochs": "1",
    "trainer.total_training_steps": "400", "trainer.resume_mode": "auto", "trainer.val_before_train": "False",
    "trainer.log_val_generations": "0",
    "trainer.default_local_dir": "$HOME/verl/ckpts/wuxibin_dapo/deepseek_v4_flash_grpo_vllm_megatron",
    "actor_rollout_ref.nccl_timeout": "3600",
}


def published_overrides(compose_on_0_9_1: bool = False) -> list[str]:
    """The script's command line after ``-m verl.trainer.main_ppo``; ``compose_on_0_9_1`` drops the keys 0.9.1 no
    longer has (GONE_IN_0_9_1), without which it does not compose."""
    keys = {k: v for k, v in PUBLISHED.items() if not (compose_on_0_9_1 and k in GONE_IN_0_9_1)}
    return ["model_engine=megatron"] + [f"{k}={v}" for k, v in keys.items()]


def bare_key(override: str) -> str:
    """'++a.b=1' -> 'a.b' (the key an override sets, without Hydra's + and ++)."""
    return override.split("=", 1)[0].lstrip("+")
