"""Every recipe field on verl 0.9.1: the verl key it becomes (``mapped``), why verl cannot express some of its values
(``refused``, checked in ``checks.verl_problems``), what verl runs differently and by how much (``departure``,
sentences from :func:`departures`), or what repro itself does with it (``ours``: the data files, the dry run's memory
budget, `repro check`). tests/test_verl_mapping.py holds this table to the schema: every field, once.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

from repro.verl.overrides import ACTOR, CORRECTION, MEGATRON, OPTIM, OVERRIDE_OPTIM, ROLLOUT, TRANSFORMER, VLLM_KWARGS

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe


class Row(NamedTuple):
    field: str      # recipe field (a section's name ending in .* covers every field in it)
    key: str        # the verl key(s), or what reads it
    status: str     # mapped | refused | departure | ours (a value outside what verl expresses is refused)
    note: str = ""


MAPPING: tuple[Row, ...] = (
    Row("name", "trainer.experiment_name", "mapped", "unless tracking.wandb.name is set"),
    Row("description", "-", "ours", "the record only"),
    Row("engine", "-", "ours", "picks verl"),
    Row("seed", "data.seed, actor.megatron.seed", "mapped", "vLLM's rollout.seed stays verl's 42"),
    Row("steps", "trainer.total_training_steps", "mapped"),
    Row("cluster.num_nodes", "trainer.nnodes (verl.nodes or actor.nodes)", "departure",
        "sync verl colocates trainer and rollout on the same GPUs; AMD's separate rollout node is left idle"),
    Row("cluster.gpus_per_node", "trainer.n_gpus_per_node", "mapped", "0 (CPU) refused"),
    Row("cluster.accelerator", "trainer.device=cuda", "mapped", "cpu refused; ROCm's torch is torch.cuda"),
    Row("cluster.device_memory_gb", "-", "ours", "dry run's memory budget"),
    Row("cluster.host_memory_gb", "-", "ours", "dry run's memory budget"),
    Row("cluster.ray_address", "+ray_kwargs.ray_init.address", "mapped"),
    Row("cluster.colocate", "-", "departure", "verl's sync trainer always shares the GPUs (sleep/wake, not halves)"),
    Row("cluster.versions.*", "-", "ours", "`repro check`"),
    Row("cluster.cpu_threads_per_worker", "-", "ours", "CPU mode of repro's loop only"),
    Row("model.name", "-", "ours", "the record only"),
    Row("model.path", "actor_rollout_ref.model.path", "mapped", "builtin: refused"),
    Row("model.num_parameters", "-", "ours", "sizes for the dry run; verl reads config.json"),
    Row("model.num_active_parameters", "-", "ours", "FLOP estimates"),
    Row("model.num_routed_experts", "-", "ours", "EP check, memory budget"),
    Row("model.num_experts_per_tok", "-", "ours", "memory budget"),
    Row("model.num_layers", "-", "ours", "memory budget"),
    Row("model.hidden_size", "-", "ours", "memory budget"),
    Row("model.vocab_size", "-", "ours", "memory budget"),
    Row("model.residual_streams", "-", "ours", "memory budget"),
    Row("model.num_expert_parameters", "-", "ours", "memory budget"),
    Row("actor.backend", "model_engine=megatron", "mapped", "embedded refused"),
    Row("actor.num_workers", "trainer.nnodes x n_gpus_per_node", "mapped", "with verl.nodes, the same count"),
    Row("actor.nodes", "trainer.nnodes", "mapped"),
    Row("actor.tensor_parallel", MEGATRON + "tensor_model_parallel_size", "mapped"),
    Row("actor.pipeline_parallel", MEGATRON + "pipeline_model_parallel_size", "mapped"),
    Row("actor.expert_parallel", MEGATRON + "expert_model_parallel_size", "mapped"),
    Row("actor.expert_tensor_parallel", MEGATRON + "expert_tensor_parallel_size", "mapped"),
    Row("actor.sequence_parallel", MEGATRON + "sequence_parallel", "mapped"),
    Row("actor.recompute", TRANSFORMER + "recompute_granularity/method/num_layers", "mapped", "full: uniform, 1"),
    Row("actor.dtype", MEGATRON + "dtype=bfloat16", "mapped", "fp32 refused (megatron.dtype: bf16/fp16 only)"),
    Row("actor.optimizer_cpu_offload", OVERRIDE_OPTIM + "optimizer_cpu_offload", "mapped"),
    Row("actor.optimizer_offload_fraction", OVERRIDE_OPTIM + "optimizer_offload_fraction", "mapped"),
    Row("actor.optimizer_moment_dtype", OPTIM + "use_precision_aware_optimizer, exp_avg(_sq)_dtype", "mapped"),
    Row("actor.num_layers_in_first_pipeline_stage", TRANSFORMER + "num_layers_in_first_pipeline_stage", "mapped"),
    Row("actor.num_layers_in_last_pipeline_stage", TRANSFORMER + "num_layers_in_last_pipeline_stage", "mapped"),
    Row("actor.max_tokens_per_micro_batch", ACTOR + "ppo_max_token_len_per_gpu (use_dynamic_bsz)", "mapped"),
    Row("actor.model_provider", "-", "ours", "repro's Megatron builder; verl builds the model through its bridge"),
    Row("actor.old_logprobs_from_update", "-", "ours", "repro's embedded trainer only"),
    Row("actor.cpu_update_threads", "-", "ours", "repro's embedded trainer only"),
    Row("actor.bf16_gemm", "-", "ours", "how repro's embedded trainer computes BF16 GEMMs on a CPU"),
    Row("optim.lr", OPTIM + "lr", "mapped"),
    Row("optim.schedule", OPTIM + "lr_decay_style", "mapped"),
    Row("optim.warmup_steps", OPTIM + "lr_warmup_steps", "mapped"),
    Row("optim.betas", OVERRIDE_OPTIM + "adam_beta1/adam_beta2", "mapped", "optim.betas is ignored on Megatron"),
    Row("optim.eps", OVERRIDE_OPTIM + "adam_eps", "mapped"),
    Row("optim.weight_decay", OPTIM + "weight_decay", "mapped"),
    Row("optim.weight_decay_rule", "-", "mapped", "megatron's own param groups (no decay on biases and 1-D "
        "parameters) are verl's; 'all' refused"),
    Row("optim.grad_clip", OPTIM + "clip_grad", "mapped"),
    Row("rollout.backend", ROLLOUT + "name=vllm", "mapped", "embedded refused"),
    Row("rollout.num_replicas", "-", "departure", "colocated: one vLLM replica per rollout.tensor_parallel GPUs"),
    Row("rollout.tensor_parallel", ROLLOUT + "tensor_model_parallel_size", "mapped"),
    Row("rollout.weight_format", ROLLOUT + "quantization=fp8 | null", "mapped"),
    Row("rollout.fp8_format", "-", "departure", "vLLM picks the encoding by platform (fnuz on gfx942), as 'auto'"),
    Row("rollout.fp8_block", "-", "mapped", "[128, 128] is vLLM's; others refused"),
    Row("rollout.fp8_scale", "-", "mapped", "fp32 scales; ue8m0 refused"),
    Row("rollout.gpu_memory_utilization", ROLLOUT + "gpu_memory_utilization", "mapped"),
    Row("rollout.disable_custom_all_reduce", VLLM_KWARGS + "disable_custom_all_reduce", "mapped"),
    Row("rollout.kv_cache_dtype", VLLM_KWARGS + "kv_cache_dtype", "mapped", "auto: not written"),
    Row("rollout.max_num_seqs", ROLLOUT + "max_num_seqs", "mapped"),
    Row("rollout.max_num_batched_tokens", ROLLOUT + "max_num_batched_tokens", "mapped"),
    Row("rollout.enforce_eager", ROLLOUT + "enforce_eager", "mapped"),
    Row("rollout.temperature", ROLLOUT + "temperature", "mapped"),
    Row("rollout.logprobs_mode", ROLLOUT + "logprobs_mode=raw_logprobs|processed_logprobs", "mapped"),
    Row("rollout.top_p", ROLLOUT + "top_p", "mapped"),
    Row("rollout.top_k", ROLLOUT + "top_k", "mapped"),
    Row("rollout.requests", ROLLOUT + "n", "departure", "verl asks for rollout.n responses of each prompt its own "
        "way, with vLLM's seed; LumenRL's unseeded n=1 requests and our seeded ones are not expressed"),
    Row("rollout.activation_quant", ROLLOUT + "quantization=fp8 (W8A8)", "mapped", "none with fp8 weights refused"),
    Row("rollout.activation_group", "-", "mapped", "128 is vLLM's; others refused"),
    Row("rollout.activation_dtype", ROLLOUT + "dtype=bfloat16", "mapped", "fp32 refused"),
    Row("lengths.max_context", ROLLOUT + "max_model_len; data.max_prompt_length = context - response", "mapped"),
    Row("lengths.max_response", "data.max_response_length", "mapped"),
    Row("data.train.*", "data.train_files (our parquet in verl's layout)", "ours", "kind/template/dedupe applied"),
    Row("data.order", "data.shuffle, data.seed", "departure",
        "verl's own seeded shuffle, not LumenRL's torch.randperm order (step 1's 32 prompts differ from AMD's)"),
    Row("data.chat_encoding", "-", "departure",
        "verl turns our messages into text with the tokenizer's chat template; DeepSeek-V4's encoder, which "
        "LumenRL uses for a release without one, is not applied"),
    Row("data.eval.*", "data.val_files (our parquet, deduplicated)", "ours", "AIME: 30 rows"),
    Row("algorithm.prompts_per_step", "data.train_batch_size", "mapped"),
    Row("algorithm.responses_per_prompt", ROLLOUT + "n", "mapped"),
    Row("algorithm.norm_adv_by_std", "algorithm.norm_adv_by_std_in_grpo", "mapped"),
    Row("algorithm.adv_std", "-", "departure", "verl divides by the sample std + 1e-6: population gives x0.935 at 8"),
    Row("algorithm.clip_ratio_low", ACTOR + "clip_ratio_low", "mapped"),
    Row("algorithm.clip_ratio_high", ACTOR + "clip_ratio_high", "mapped"),
    Row("algorithm.loss_agg_mode", ACTOR + "loss_agg_mode", "mapped"),
    Row("algorithm.clip_ratio_c", ACTOR + "clip_ratio_c", "mapped", "null (off) is 1e9, above verl's largest ratio"),
    Row("algorithm.kl_coef", ACTOR + "use_kl_loss=False", "mapped", "only 0; others refused"),
    Row("algorithm.entropy_coef", ACTOR + "entropy_coeff", "mapped"),
    Row("algorithm.updates_per_step", ACTOR + "ppo_mini_batch_size = prompts / updates", "mapped"),
    Row("rollout_correction.mode", CORRECTION + "rollout_is (+ IcePop threshold for *_mask)", "mapped"),
    Row("rollout_correction.threshold", CORRECTION + "rollout_is_threshold", "mapped"),
    Row("rollout_correction.lower_threshold", CORRECTION + "rollout_is_threshold='lower_upper'", "mapped"),
    Row("rollout_correction.verl_metrics", "-", "departure", "verl logs rollout_corr/* with LumenRL's definitions"),
    Row("routing_replay.enabled", MEGATRON + "router_replay.mode=R3, " + ROLLOUT + "enable_rollout_routing_replay",
        "mapped"),
    Row("routing_replay.mode", "-", "mapped", "R3 replays expert ids; gates from the trainer's router"),
    Row("reward.kind", "reward.custom_reward_function.path/name", "mapped", "repro's DAPO rule"),
    Row("reward.verifier", "reward.custom_reward_function", "mapped", "math_verify needs verl.reward_function"),
    Row("reward.boxed_fallback", "+reward.custom_reward_function.reward_kwargs.boxed_fallback", "mapped"),
    Row("eval.every_steps", "trainer.test_freq", "mapped", "and after the last step, as ours"),
    Row("eval.at_start", "trainer.val_before_train", "mapped"),
    Row("eval.after_first_update", "-", "departure", "verl evaluates at multiples of test_freq only"),
    Row("eval.answer_format", "data.val_files", "ours", "LumenRL's answer-format line written into the "
        "evaluation messages"),
    Row("eval.samples_per_problem", ROLLOUT + "val_kwargs.n", "mapped"),
    Row("eval.temperature", ROLLOUT + "val_kwargs.temperature", "mapped"),
    Row("eval.top_p", ROLLOUT + "val_kwargs.top_p", "mapped"),
    Row("checkpoint.every_steps", "trainer.save_freq", "mapped", "and the last step"),
    Row("checkpoint.keep_last", "trainer.max_actor_ckpt_to_keep", "mapped"),
    Row("checkpoint.max_restarts", "-", "ours", "verl stops when a worker dies; rerun with --resume"),
    Row("weight_sync.transport", "-", "departure", "colocated: in-node CUDA IPC (checkpoint_engine naive), no RDMA"),
    Row("weight_sync.bucket_mb", ROLLOUT + "checkpoint_engine.update_weights_bucket_megabytes", "mapped"),
    Row("weight_sync.quantize_on", "-", "mapped", "rollout: vLLM quantises as it loads; trainer refused"),
    Row("weight_sync.timeout_s", "actor_rollout_ref.nccl_timeout", "mapped"),
    Row("weight_sync.vllm_engine", "-", "ours", "repro's loop only"),
    Row("tracking.wandb.*", "trainer.logger wandb, project_name; WANDB_MODE/ENTITY/DIR for the workers", "mapped"),
    Row("tracking.tensorboard", "trainer.logger tensorboard; TENSORBOARD_DIR", "mapped"),
    Row("tracking.rollouts", "-", "departure", "not written: verl's dumps carry no log-probs or advantages"),
    Row("lumenrl.*", "-", "ours", "engine lumenrl only"),
    Row("verl.*", "(this engine's site settings)", "ours"),
)


def departures(recipe: "Recipe") -> list[str]:
    """Where verl will run this recipe differently, with the number it changes (printed, kept in the config)."""
    r, notes = recipe, []
    group = r.algorithm.responses_per_prompt
    if r.algorithm.norm_adv_by_std and r.algorithm.adv_std == "population":
        notes.append(f"algorithm.adv_std=population: verl divides by the sample std (+1e-6), so every advantage is "
                     f"sqrt((G-1)/G) = {math.sqrt((group - 1) / group):.3f} of the population-std one at G = {group}")
    nodes = r.verl.nodes or r.actor.nodes
    trainer_gpus = nodes * r.cluster.gpus_per_node
    if r.actor.nodes < r.cluster.num_nodes or r.rollout.tensor_parallel * r.rollout.num_replicas != trainer_gpus:
        notes.append(f"layout: verl's synchronous trainer colocates the rollout on the trainer's {trainer_gpus} GPUs "
                     f"({nodes} node(s)), {trainer_gpus // r.rollout.tensor_parallel} vLLM replica(s) of TP"
                     f"{r.rollout.tensor_parallel}; the recipe's {r.cluster.num_nodes}-node split (trainer on "
                     f"{r.actor.nodes}, rollout apart) needs trainer_mode separate_async, which is one step "
                     "off-policy, so it is not used")
    if r.eval.after_first_update:
        notes.append("eval.after_first_update: verl evaluates only at multiples of trainer.test_freq (and the last "
                     "step), so there is no evaluation after step 1 to set beside AMD's 'start' AIME figure")
    if r.rollout_correction.verl_metrics:
        notes.append("rollout_correction.verl_metrics: verl 0.9.1 logs rollout_corr/* with LumenRL's definitions "
                     "(since verl PR #5722); the older verl variants are not produced")
    if r.tracking.rollouts:
        notes.append("tracking.rollouts: not written (verl's rollout_data_dir dumps carry no log-probs or "
                     "advantages); `repro rollouts` has nothing to show for this run")
    if r.weight_sync.transport == "rdma":
        notes.append("weight_sync.transport=rdma: colocated verl hands weights to vLLM on the same GPUs "
                     "(checkpoint_engine naive); there is no RDMA hop to measure")
    if r.checkpoint.max_restarts:
        notes.append("checkpoint.max_restarts: does not apply (verl stops when a worker dies; rerun with --resume)")
    return notes


def markdown_table() -> str:
    """MAPPING as the table docs/verl.md shows (tests/test_verl_engine.py keeps the two the same)."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| recipe field | verl key | status | note |", "|---|---|---|---|"]
    lines += [f"| `{r.field}` | {'-' if r.key == '-' else '`' + cell(r.key) + '`'} | {r.status} | {cell(r.note)} |"
              for r in MAPPING]
    return "\n".join(lines)
