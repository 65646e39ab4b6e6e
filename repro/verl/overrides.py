"""The recipe as verl 0.9.1's Hydra overrides: ``python -m verl.trainer.main_ppo model_engine=megatron KEY=VALUE ...``.

verl composes ``ppo_trainer.yaml`` with the overrides (a key its schema lacks must be added with ``+``); we write
every key the recipe decides (:func:`recipe_overrides`), then the keys this run decides (:func:`run_overrides`:
files, checkpoints, resume, loggers, the environment its Ray workers get), then the recipe's ``verl.overrides``. Which
recipe field becomes which key, and which fields verl cannot express or runs differently, is ``mapping.MAPPING``.

Facts from the 0.9.1 wheel these rest on: ``actor.optim.betas`` is not read on the Megatron path
(``verl/utils/megatron/optimizer.py`` ``init_megatron_optim_config`` passes optimizer, lr, min_lr, clip_grad and
weight_decay, then ``override_optimizer_config`` item by item into megatron's ``OptimizerConfig``), so betas and eps
go through ``+...override_optimizer_config.adam_beta1/adam_beta2/adam_eps``; the dual-clip constant must be > 1
(``core_algos.py`` asserts it) and the ratio it caps is ``exp(clamp(log-ratio, -20, 20))`` <= 4.9e8, so
``DUAL_CLIP_OFF`` = 1e9 never binds (off, exactly); vLLM's logprobs modes are named ``raw_logprobs`` /
``processed_logprobs``; environment reaches the Ray workers only through ``ray_kwargs.ray_init.runtime_env``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe

ACTOR = "actor_rollout_ref.actor."
MEGATRON = ACTOR + "megatron."
OPTIM = ACTOR + "optim."
OVERRIDE_OPTIM = "+" + OPTIM + "override_optimizer_config."
TRANSFORMER = "++" + MEGATRON + "override_transformer_config."
ROLLOUT = "actor_rollout_ref.rollout."
VLLM_KWARGS = "+" + ROLLOUT + "engine_kwargs.vllm."
CORRECTION = "algorithm.rollout_correction."
WORKER_ENV = "+ray_kwargs.ray_init.runtime_env.env_vars."
DUAL_CLIP_OFF = 1.0e9  # > exp(20), verl's largest ratio: the dual-clip cap never binds
LOGPROBS_MODE = {"raw": "raw_logprobs", "processed": "processed_logprobs"}
REWARD_FUNCTION = "compute_score"


@dataclass(frozen=True)
class RunFiles:
    """What this run decides: where verl reads and writes, and where it resumes from."""

    train_file: Path
    val_file: Path
    checkpoint_dir: Path
    metrics_file: Path            # $VERL_FILE_LOGGER_PATH of this attempt (verl truncates it when it starts)
    reward_file: Path
    resume_from: Path | None      # the global_step_N folder to resume from (None: a new run)
    run_dir: Path


def verl_nodes(recipe: "Recipe") -> int:
    return recipe.verl.nodes or recipe.actor.nodes


def threshold(recipe: "Recipe") -> float | str:
    """rollout_is_threshold: the cap C, or verl's 'lower_upper' (IcePop) for the *_mask modes."""
    correction = recipe.rollout_correction
    if not correction.mode.endswith("_mask"):
        return correction.threshold
    lower = correction.lower_threshold if correction.lower_threshold is not None else 1.0 / correction.threshold
    return f"{lower!r}_{correction.threshold!r}"


def recipe_overrides(recipe: "Recipe") -> dict[str, Any]:
    """Every verl key the recipe decides: key (with Hydra's + where verl's schema lacks it) -> value."""
    r = recipe
    fp8 = r.rollout.weight_format == "fp8_block"
    mode = r.rollout_correction.mode
    prompt_length = r.lengths.max_context - r.lengths.max_response
    out: dict[str, Any] = {
        "trainer.nnodes": verl_nodes(r), "trainer.n_gpus_per_node": r.cluster.gpus_per_node,
        "trainer.device": "cuda",  # ROCm's torch is torch.cuda too
        "trainer.total_training_steps": r.steps, "trainer.total_epochs": 1000,  # the step count ends the run
        "trainer.experiment_name": r.tracking.wandb.name or r.name, "trainer.project_name": r.tracking.wandb.project,
        "actor_rollout_ref.model.path": r.model.path, "actor_rollout_ref.model.trust_remote_code": True,
        "actor_rollout_ref.model.use_remove_padding": True,
        "data.train_batch_size": r.algorithm.prompts_per_step, "data.max_prompt_length": prompt_length,
        "data.max_response_length": r.lengths.max_response, "data.filter_overlong_prompts": True,
        "data.truncation": "error", "data.seed": r.seed, "data.prompt_key": "prompt", "data.return_raw_chat": True,
        MEGATRON + "tensor_model_parallel_size": r.actor.tensor_parallel,
        MEGATRON + "pipeline_model_parallel_size": r.actor.pipeline_parallel,
        MEGATRON + "expert_model_parallel_size": r.actor.expert_parallel,
        MEGATRON + "expert_tensor_parallel_size": r.actor.expert_tensor_parallel,
        MEGATRON + "sequence_parallel": r.actor.sequence_parallel,
        MEGATRON + "seed": r.seed, MEGATRON + "dtype": "bfloat16",
        # the rollout shares the trainer's GPUs: verl moves the trainer's state to the host while vLLM generates
        MEGATRON + "param_offload": True, MEGATRON + "optimizer_offload": True,
        MEGATRON + "router_replay.mode": "R3" if r.routing_replay.enabled else "disabled",
        ACTOR + "use_dynamic_bsz": True, ACTOR + "ppo_max_token_len_per_gpu": r.actor.max_tokens_per_micro_batch,
        ACTOR + "ppo_mini_batch_size": r.algorithm.prompts_per_step // r.algorithm.updates_per_step,
        ACTOR + "ppo_epochs": 1,
        ACTOR + "clip_ratio_low": r.algorithm.clip_ratio_low, ACTOR + "clip_ratio_high": r.algorithm.clip_ratio_high,
        ACTOR + "clip_ratio_c": r.algorithm.clip_ratio_c if r.algorithm.clip_ratio_c is not None else DUAL_CLIP_OFF,
        ACTOR + "loss_agg_mode": r.algorithm.loss_agg_mode, ACTOR + "entropy_coeff": r.algorithm.entropy_coef,
        ACTOR + "use_kl_loss": False, "algorithm.use_kl_in_reward": False,
        OPTIM + "lr": r.optim.lr, OPTIM + "lr_warmup_steps": r.optim.warmup_steps,
        OPTIM + "lr_decay_style": r.optim.schedule, OPTIM + "weight_decay": r.optim.weight_decay,
        OPTIM + "clip_grad": r.optim.grad_clip,
        OVERRIDE_OPTIM + "adam_beta1": r.optim.betas[0], OVERRIDE_OPTIM + "adam_beta2": r.optim.betas[1],
        OVERRIDE_OPTIM + "adam_eps": r.optim.eps,
        "algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": r.algorithm.norm_adv_by_std,
        CORRECTION + "rollout_is": None if mode == "none" else mode.removesuffix("_mask"),
        CORRECTION + "rollout_is_threshold": threshold(r),
        ROLLOUT + "name": "vllm", ROLLOUT + "mode": "async", ROLLOUT + "n": r.algorithm.responses_per_prompt,
        ROLLOUT + "tensor_model_parallel_size": r.rollout.tensor_parallel,
        ROLLOUT + "gpu_memory_utilization": r.rollout.gpu_memory_utilization,
        ROLLOUT + "max_model_len": r.lengths.max_context, ROLLOUT + "max_num_seqs": r.rollout.max_num_seqs,
        ROLLOUT + "max_num_batched_tokens": r.rollout.max_num_batched_tokens,
        ROLLOUT + "enforce_eager": r.rollout.enforce_eager, ROLLOUT + "dtype": "bfloat16",
        ROLLOUT + "temperature": r.rollout.temperature, ROLLOUT + "top_p": r.rollout.top_p,
        ROLLOUT + "top_k": r.rollout.top_k, ROLLOUT + "calculate_log_probs": True,
        ROLLOUT + "logprobs_mode": LOGPROBS_MODE[r.rollout.logprobs_mode],
        ROLLOUT + "enable_rollout_routing_replay": r.routing_replay.enabled,
        ROLLOUT + "enable_prefix_caching": not r.routing_replay.enabled,  # R3 records routes of every prompt token
        ROLLOUT + "quantization": "fp8" if fp8 else None,
        ROLLOUT + "checkpoint_engine.update_weights_bucket_megabytes": r.weight_sync.bucket_mb,
        "actor_rollout_ref.nccl_timeout": int(r.weight_sync.timeout_s),
        VLLM_KWARGS + "disable_custom_all_reduce": r.rollout.disable_custom_all_reduce,
        ROLLOUT + "val_kwargs.n": r.eval.samples_per_problem, ROLLOUT + "val_kwargs.do_sample": True,
        ROLLOUT + "val_kwargs.temperature": r.eval.temperature, ROLLOUT + "val_kwargs.top_p": r.eval.top_p,
        ROLLOUT + "val_kwargs.top_k": -1,
        "trainer.test_freq": r.eval.every_steps if r.eval.every_steps <= r.steps else -1,
        "trainer.val_before_train": r.eval.at_start, "trainer.log_val_generations": 0,
        "trainer.save_freq": r.checkpoint.every_steps, "trainer.max_actor_ckpt_to_keep": r.checkpoint.keep_last,
        "reward.custom_reward_function.name": REWARD_FUNCTION,
        "+reward.custom_reward_function.reward_kwargs.boxed_fallback": r.reward.boxed_fallback,
    }
    if r.rollout.kv_cache_dtype != "auto":
        out[VLLM_KWARGS + "kv_cache_dtype"] = r.rollout.kv_cache_dtype
    if r.actor.recompute == "full":  # as verl's DSV4 script: whole layers, one at a time
        out.update({TRANSFORMER + "recompute_granularity": "full", TRANSFORMER + "recompute_method": "uniform",
                    TRANSFORMER + "recompute_num_layers": 1})
    else:
        out[TRANSFORMER + "recompute_granularity"] = None
    for stage in ("first", "last"):
        layers = getattr(r.actor, f"num_layers_in_{stage}_pipeline_stage")
        if layers is not None and r.actor.pipeline_parallel > 1:
            out[TRANSFORMER + f"num_layers_in_{stage}_pipeline_stage"] = layers
    if r.actor.optimizer_cpu_offload:
        out.update({OVERRIDE_OPTIM + "optimizer_cpu_offload": True,
                    OVERRIDE_OPTIM + "optimizer_offload_fraction": r.actor.optimizer_offload_fraction,
                    OVERRIDE_OPTIM + "overlap_cpu_optimizer_d2h_h2d": True})
    if r.actor.optimizer_moment_dtype != "fp32":  # megatron's precision-aware optimizer, as verl names it
        out.update({OPTIM + "use_precision_aware_optimizer": True, OPTIM + "exp_avg_dtype": "bf16",
                    OPTIM + "exp_avg_sq_dtype": "bf16"})
    return out


def loggers(recipe: "Recipe") -> list[str]:
    """verl's trainer.logger: console and file always (the stream reads the file), W&B and TensorBoard as asked."""
    names = ["console", "file"]
    names += ["wandb"] if recipe.tracking.wandb.enabled else []
    return names + (["tensorboard"] if recipe.tracking.tensorboard else [])


def worker_env(recipe: "Recipe", files: RunFiles) -> dict[str, str]:
    """The environment verl's TaskRunner and workers need (verl's Tracking runs in the TaskRunner, a Ray actor)."""
    env = {"VERL_FILE_LOGGER_PATH": str(files.metrics_file)}
    wandb = recipe.tracking.wandb
    if wandb.enabled:
        env.update({"WANDB_MODE": wandb.mode, "WANDB_DIR": str(files.run_dir)})
        env.update({"WANDB_ENTITY": wandb.entity} if wandb.entity else {})
    if recipe.tracking.tensorboard:
        env["TENSORBOARD_DIR"] = str(files.run_dir / "tensorboard")
    return {**env, **recipe.verl.env}


def run_overrides(recipe: "Recipe", files: RunFiles, env: dict[str, str]) -> dict[str, Any]:
    """The keys this run decides: data files, reward file, checkpoints and resume (never ``auto``, which starts
    from scratch without a word when the tracker file is missing), loggers, and the workers' environment."""
    out: dict[str, Any] = {
        "data.train_files": str(files.train_file), "data.val_files": str(files.val_file),
        "reward.custom_reward_function.path": str(files.reward_file),
        "trainer.default_local_dir": str(files.checkpoint_dir),
        "trainer.resume_mode": "resume_path" if files.resume_from else "disable",
        "trainer.resume_from_path": str(files.resume_from) if files.resume_from else None,
        "trainer.logger": loggers(recipe),
        # the evaluation before the first update happens once, not again at every resume
        "trainer.val_before_train": recipe.eval.at_start and files.resume_from is None,
    }
    address = recipe.cluster.ray_address
    if address:
        out["+ray_kwargs.ray_init.address"] = address
    out.update({WORKER_ENV + name: value for name, value in env.items()})
    return out


_PLAIN = re.compile(r"^[A-Za-z0-9_./:@-]+$")


def hydra_value(value: Any) -> str:
    """A value in Hydra's override grammar: null, True/False, numbers, [lists], strings quoted unless plain."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in ("null", "true", "false") and not _looks_numeric(text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def verl_overrides(recipe: "Recipe", files: RunFiles, env: dict[str, str]) -> list[str]:
    """The command line after ``-m verl.trainer.main_ppo``: engine group, recipe keys, run keys, the recipe's own."""
    keys = {**recipe_overrides(recipe), **run_overrides(recipe, files, env)}
    return ["model_engine=megatron"] + [f"{k}={hydra_value(v)}" for k, v in keys.items()] + list(recipe.verl.overrides)
