"""The recipe as LumenRL's config: the keys the recipe determines, written over a published LumenRL config.

LumenRL reads one YAML (``python -m lumenrl.trainer.main --config FILE key=value ...``; OmegaConf over its
``LumenRLConfig`` dataclasses, so an unknown key is an error there). We start from the published file in the
checkout (``lumenrl.base_config``, by default ``examples/GRPO/configs/grpo_dsv4_flash_vllm_longrun.yaml``) and replace
every key the recipe determines (:func:`recipe_settings`); everything else -- RDMA NIC names, Megatron memory
knobs, the vLLM server transport -- stays as AMD published it. Site and run settings (checkpoint folder, resume,
node pinning, W&B) come from :func:`run_settings`.

Only keys that LumenRL's DeepSeek-V4 path reads are written (Ray controller, ``megatron_lumen_dsv4`` trainer, vLLM
``ray_http`` rollout, RDMA weight sync; at 2232f55 -- tests/test_lumenrl_config.py names the line that reads each).
Not written, because that path never reads them or something else decides them: ``policy.lr_decay_style`` (the DSV4
engine's scheduler is constant in code), ``policy.training.optimizer_dtype`` (FSDP only; the DSV4 engine trains in
BF16 whatever it says), ``quantization.rollout.precision`` (vLLM's ``quantization`` decides), ``vllm_cfg.
update_weights_bucket_megabytes`` (the IPC sync; RDMA uses ``weight_sync.bucket_size_mb``), ``moe.r3.replay_mode``
(a debug message only), ``reward.function`` (the trainer scores with LumenRL's DAPO math reward in code),
``algorithm.use_kl_in_reward`` (the non-Ray trainer only), ``megatron_cfg.num_experts`` (the checkpoint's
config.json wins), ``policy.gen_batch_size`` (GRPO draws ``train_global_batch_size / num_generations`` prompts per
step) and ``rollout.fp8_format`` / ``fp8_block`` / ``fp8_scale`` (vLLM's ``fp8_per_block`` decides them).

On the AMD recipe the written values equal LumenRL's longrun file (@2232f554) key for key, except
``num_training_steps`` 75 (the post's run; the file says 200, and run_grpo_dsv4.sh passes the step count) and the
data paths, which are the site's (tests/test_lumenrl_config.py holds this). ``gpu_memory_utilization`` is the file's
0.92 (the post writes 90%) and ``val_steps`` the file's 5. Where LumenRL does not do what the recipe says -- its
Megatron seed is always 42 -- the written config's header says so (:func:`config_notes`).
"""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from repro.errors import RecipeError
from repro.lumenrl.tracking import logger_settings
from repro.recipes.lumenrl_checks import TRAINING_BACKEND

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe

VLLM = "policy.generation.vllm_cfg."
MEGATRON = "policy.training.megatron_cfg."
# What LumenRL says of itself where it differs from a recipe's words
QUANTIZE_ON = {"rollout": "inference", "trainer": "trainer"}


def _per_node(workers: int, gpus_per_node: int) -> list[int]:
    """Workers per node, filling each node before the next (LumenRL's process_on_nodes)."""
    full, rest = divmod(workers, max(gpus_per_node, 1))
    return [gpus_per_node] * full + ([rest] if rest else [])


def recipe_settings(recipe: "Recipe") -> dict[str, Any]:
    """Every LumenRL key the recipe determines: dotted key path -> value (LumenRL's names, LumenRL's units)."""
    r = recipe
    fp8 = r.rollout.weight_format == "fp8_block"
    val_steps = r.eval.every_steps if r.eval.every_steps <= r.steps else 0  # 0: LumenRL's in-loop validation off
    rollout_gpus = r.rollout.tensor_parallel * r.rollout.num_replicas
    # LumenRL's streamed Adam needs every optimizer state in host memory and refuses to start otherwise
    streamed = r.actor.optimizer_cpu_offload and r.actor.optimizer_offload_fraction == 1.0
    settings = {
        "cluster.num_nodes": r.cluster.num_nodes,
        "cluster.gpus_per_node": r.cluster.gpus_per_node,
        "cluster.ray_address": r.cluster.ray_address,
        "controller.ray.actor.num_workers": r.actor.num_workers,
        "controller.ray.actor.process_on_nodes": _per_node(r.actor.num_workers, r.actor.num_workers // r.actor.nodes),
        "controller.ray.rollout.num_workers": rollout_gpus,
        "controller.ray.rollout.process_on_nodes": _per_node(rollout_gpus, r.cluster.gpus_per_node),
        "weight_sync.backend": r.weight_sync.transport,
        "weight_sync.bucket_size_mb": r.weight_sync.bucket_mb,
        "weight_sync.timeout_s": math.ceil(r.weight_sync.timeout_s),  # an int in LumenRL's schema
        "weight_sync.fp8_quantization_location": QUANTIZE_ON[r.weight_sync.quantize_on] if fp8 else None,
        "policy.model_name": r.model.path,
        "policy.training_backend": TRAINING_BACKEND,
        "policy.generation_backend": r.rollout.backend,
        "policy.max_total_sequence_length": r.lengths.max_context,
        "policy.max_response_length": r.lengths.max_response,
        "policy.train_global_batch_size": r.trajectories_per_step,
        "policy.max_token_len_per_gpu": r.actor.max_tokens_per_micro_batch,
        "policy.optimizer_type": "adam",  # the schema's optimizer is Adam(W)
        "policy.learning_rate": r.optim.lr,
        "policy.lr_warmup_steps": r.optim.warmup_steps,
        "policy.weight_decay": r.optim.weight_decay,
        "policy.max_grad_norm": r.optim.grad_clip,
        "policy.adam_beta1": r.optim.betas[0],
        "policy.adam_beta2": r.optim.betas[1],
        "policy.adam_eps": r.optim.eps,
        MEGATRON + "tensor_model_parallel_size": r.actor.tensor_parallel,
        MEGATRON + "pipeline_model_parallel_size": r.actor.pipeline_parallel,
        MEGATRON + "expert_model_parallel_size": r.actor.expert_parallel,
        MEGATRON + "expert_tensor_parallel_size": r.actor.expert_tensor_parallel,
        MEGATRON + "sequence_parallel": r.actor.sequence_parallel,
        MEGATRON + "recompute_granularity": None if r.actor.recompute == "none" else r.actor.recompute,
        MEGATRON + "optimizer_cpu_offload": r.actor.optimizer_cpu_offload,
        MEGATRON + "optimizer_offload_fraction": r.actor.optimizer_offload_fraction,
        MEGATRON + "streamed_optimizer_mode": "adam" if streamed else "off",
        MEGATRON + "streamed_optimizer_moment_dtype": r.actor.optimizer_moment_dtype,
        MEGATRON + "num_layers_in_first_pipeline_stage": r.actor.num_layers_in_first_pipeline_stage,
        MEGATRON + "num_layers_in_last_pipeline_stage": r.actor.num_layers_in_last_pipeline_stage,
        VLLM + "tensor_parallel_size": r.rollout.tensor_parallel,
        VLLM + "quantization": "fp8_per_block" if fp8 else "",
        VLLM + "kv_cache_dtype": r.rollout.kv_cache_dtype,
        VLLM + "gpu_memory_utilization": r.rollout.gpu_memory_utilization,
        VLLM + "max_model_len": r.lengths.max_context,
        VLLM + "max_num_seqs": r.rollout.max_num_seqs,
        VLLM + "max_num_batched_tokens": r.rollout.max_num_batched_tokens,
        VLLM + "enforce_eager": r.rollout.enforce_eager,
        VLLM + "disable_custom_all_reduce": r.rollout.disable_custom_all_reduce,
        VLLM + "temperature": r.rollout.temperature,
        VLLM + "top_p": r.rollout.top_p,
        VLLM + "top_k": r.rollout.top_k,
        "algorithm.name": "grpo",
        "algorithm.adv_estimator": "grpo",
        "algorithm.loss_agg_mode": r.algorithm.loss_agg_mode,
        "algorithm.clip_ratio_high": r.algorithm.clip_ratio_high,
        "algorithm.grpo.num_generations": r.algorithm.responses_per_prompt,
        "algorithm.grpo.kl_coeff": r.algorithm.kl_coef,
        "algorithm.grpo.clip_ratio": r.algorithm.clip_ratio_low,
        "quantization.rollout_correction.rollout_is": (None if r.rollout_correction.mode == "none"
                                                        else r.rollout_correction.mode),
        "quantization.rollout_correction.rollout_is_threshold": r.rollout_correction.threshold,
        "moe.r3.enabled": r.routing_replay.enabled,
        "reward.dataset": r.data.train.path,
        "reward.shuffle_seed": r.seed,
        "val_dataset": r.data.eval.path,
        "val_steps": val_steps,
        # LumenRL has no evaluation before the first update; its EvalCallback evaluates right after it
        "eval.enabled": r.eval.after_first_update,
        "checkpointing.save_steps": r.checkpoint.every_steps,
        "checkpointing.save_total_limit": r.checkpoint.keep_last,
        "num_training_steps": r.steps,
        "seed": r.seed,
    }
    if val_steps or r.eval.after_first_update:  # both evaluations sample with the eval.* settings
        settings.update({"eval.num_generations": r.eval.samples_per_problem, "eval.temperature": r.eval.temperature,
                         "eval.top_p": r.eval.top_p})
    return settings


def run_settings(recipe: "Recipe", checkpoint_dir: str | os.PathLike, resume: bool) -> dict[str, Any]:
    """Keys this run and this site decide: where checkpoints go, whether to resume, node pinning, W&B, and the
    per-step log line the stream reads (``log_interval`` 1)."""
    pins = {"actor": recipe.lumenrl.actor_node_ips, "rollout": recipe.lumenrl.rollout_node_ips}
    return {
        "checkpointing.checkpoint_dir": str(checkpoint_dir),
        "checkpointing.resume": bool(resume),
        # the published file pins AMD's own machines by IP; elsewhere that placement could never be satisfied
        **{f"controller.ray.{role}.topology_tags": ({"node_ips": ips} if ips else {}) for role, ips in pins.items()},
        **logger_settings(recipe),  # the recipe's tracking.wandb (repro.lumenrl.tracking)
        "logger.log_interval": 1,
    }


def set_key(config: dict, dotted: str, value: Any) -> None:
    """``config[a][b][c] = value`` for ``dotted`` 'a.b.c', creating the sections on the way."""
    *sections, leaf = dotted.split(".")
    node = config
    for i, key in enumerate(sections):
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ValueError(f"LumenRL config: {'.'.join(sections[:i + 1])} is not a section (setting {dotted})")
    node[leaf] = value


def get_key(config: dict, dotted: str, default: Any = None) -> Any:
    node = config
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


def flatten(config: dict, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; an empty section stays a key (its value {})."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def lumenrl_config(recipe: "Recipe", base: dict, checkpoint_dir: str | os.PathLike, resume: bool) -> dict:
    """The config LumenRL runs: ``base`` (a published config, not modified) with the recipe's and the run's keys."""
    config = copy.deepcopy(base)
    for dotted, value in {**recipe_settings(recipe), **run_settings(recipe, checkpoint_dir, resume)}.items():
        set_key(config, dotted, value)
    return config


REMOVED = "(not in the written config)"


def changed_keys(base: dict, written: dict) -> list[tuple[str, Any, Any]]:
    """(key, base value, written value) for every key the writing changed, added or removed (written value
    ``REMOVED``), in the written config's order."""
    before, after = flatten(base), flatten(written)
    missing = object()
    changed = [(k, before.get(k), v) for k, v in after.items() if before.get(k, missing) != v]
    return changed + [(k, v, REMOVED) for k, v in before.items() if k not in after]


def read_base_config(path: Path) -> dict:
    """A published LumenRL config, read as plain data (YAML safe loader)."""
    if not path.is_file():
        raise RecipeError(f"lumenrl.base_config: {path} not found (a LumenRL config file in the checkout)")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise RecipeError(f"lumenrl.base_config: {path} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"lumenrl.base_config: {path} is not a mapping of sections")
    return data


def write_config(config: dict, path: Path, header: str) -> Path:
    """Write ``config`` as YAML under a comment header, to a temp file renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    tmp.write_text(comment + yaml.safe_dump(config, sort_keys=False, default_flow_style=None))
    tmp.replace(path)
    return path


def config_notes(recipe: "Recipe") -> list[str]:
    """Where LumenRL will not do what the recipe says, in sentences (printed at launch, kept in the config)."""
    notes = [f"seed={recipe.seed}: LumenRL seeds vLLM and the prompt order from it, but its Megatron trainer always "
             "from 42 (workers/actor_worker.py:305 reads policy.seed, a key LumenRL's PolicyConfig does not have; "
             "megatron_lumen_dsv4_engine.py:566, 599), so the trainer's initial randomness is not the recipe's"]
    if recipe.eval.at_start:
        notes.append("eval.at_start: LumenRL never evaluates before the first update; with "
                     "eval.after_first_update its EvalCallback evaluates right after it (logged as step 1)")
    if recipe.rollout_correction.verl_metrics:
        notes.append("rollout_correction.verl_metrics: LumenRL logs its own IS statistics only (rollout_corr/*); "
                     "verl's variants are repro's")
    if recipe.eval.after_first_update and recipe.steps > 1000:
        notes.append("eval.at_start: LumenRL's EvalCallback evaluates again after every eval.interval (1000) steps")
    if recipe.eval.every_steps > recipe.steps:
        notes.append(f"eval.every_steps={recipe.eval.every_steps} is beyond the run's {recipe.steps} steps: "
                     "LumenRL's validation is off (val_steps 0)")
    if recipe.actor.dtype != "bf16":
        notes.append(f"actor.dtype={recipe.actor.dtype}: LumenRL's DeepSeek-V4 Megatron engine trains in BF16 "
                     "whatever the config says (megatron_lumen_dsv4_engine.py:742-744, 1016-1017)")
    if not (recipe.lumenrl.actor_node_ips and recipe.lumenrl.rollout_node_ips):
        notes.append("lumenrl.actor_node_ips / rollout_node_ips: unset, so LumenRL places its workers by free GPUs; "
                     "pin them when the trainer and rollout nodes run different images (AMD's -train and -rollout)")
    if recipe.steps % recipe.checkpoint.every_steps:
        notes.append(f"checkpoint.every_steps={recipe.checkpoint.every_steps}: LumenRL saves only at multiples of "
                     f"it, so step {recipe.steps} itself is not checkpointed")
    return notes
