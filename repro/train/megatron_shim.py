"""CPU-only shim that lets megatron-core 0.16.1 run a tiny model in one gloo process (tests, laptops).

NOT for a GPU cluster: ``MegatronTrainer`` calls ``install_cpu_shim`` only when no CUDA/ROCm device is present,
and ``install_cpu_shim`` refuses to run where one is. On a cluster torchrun/Ray sets up NCCL/RCCL and
megatron-core runs unpatched.

What megatron-core assumes that a CPU box lacks, and what stands in for it here:
  * ``torch.cuda.current_device()`` is used as the ``device=`` of every parameter and buffer it allocates:
    patched to return ``"cpu"``;
  * the tensor-parallel RNG tracker forks CUDA RNG states: ``model_parallel_cuda_manual_seed(...,
    inference_rng_tracker=True)`` uses the tracker that does not touch the CUDA RNG (the model has no dropout,
    so the forward draws no random numbers anyway);
  * full activation recompute saves and restores the CUDA RNG state around each recomputed block:
    ``tensor_parallel.random._get_cuda_rng_state`` / ``_set_cuda_rng_state`` become an empty state / a no-op
    (the CPU RNG, which it also saves, is the one a CPU forward would draw from);
  * ``moe_utils.te_general_gemm`` is Transformer Engine's GEMM, imported optimistically: set to ``None`` so the
    MoE code takes its torch path;
  * a process group: gloo, world size 1, over an in-memory store (no port, no env vars).
The model side of the CPU recipe (allgather token dispatcher, no bias in linears, local layer spec without
Transformer Engine) is chosen by ``repro.train.megatron_backend.tiny_transformer_config``, not patched here.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from repro.train.base import TrainerError

_installed = False


def install_cpu_shim() -> None:
    """Patch megatron-core's CUDA assumptions for a CPU process and start a world-size-1 gloo group (idempotent)."""
    global _installed
    if torch.cuda.is_available():
        raise TrainerError(
            "megatron_shim.install_cpu_shim: a CUDA/ROCm device is present; the CPU shim must not patch a GPU "
            "process (run megatron-core unpatched under torchrun/Ray instead)"
        )
    if _installed:
        return
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    from megatron.core.tensor_parallel import random as mp_random
    from megatron.core.transformer.moe import moe_utils

    mp_random._get_cuda_rng_state = lambda *args, **kwargs: torch.empty(0, dtype=torch.uint8)
    mp_random._set_cuda_rng_state = lambda *args, **kwargs: None
    moe_utils.te_general_gemm = None
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    if dist.get_world_size() != 1:
        raise TrainerError(f"megatron_shim: the CPU shim runs world size 1, the process group has {dist.get_world_size()}")
    _installed = True


def seed_model_parallel_rng(seed: int) -> None:
    """Megatron's model-parallel RNG tracker seeded without CUDA (see the module docstring)."""
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(seed, inference_rng_tracker=True, force_reset_rng=True)
