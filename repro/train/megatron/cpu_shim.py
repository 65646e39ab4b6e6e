"""CPU-only shim that lets megatron-core 0.16.1 run a tiny model over gloo, one or several processes (tests, laptops).

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
  * torch norms refuse sequence parallelism (``_patch_torch_norm`` marks their weights as Apex/TE norms do);
  * the schedules' ``device="cuda"`` token counters and p2p ``torch.cuda.synchronize()`` (see ``_patch_schedules``);
  * a process group: the caller's gloo group (a multi-rank run:
    ``repro.train.megatron.parallel.init_distributed_from_env``), or else gloo at world size 1 over an in-memory
    store (no port, no env vars).
The model side of the CPU recipe (allgather token dispatcher, no bias in linears, local layer spec without
Transformer Engine) is chosen by ``repro.train.megatron.trainer.tiny_transformer_config``, not patched here.
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
            "cpu_shim.install_cpu_shim: a CUDA/ROCm device is present; the CPU shim must not patch a GPU "
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
    _patch_schedules()
    _patch_torch_norm()
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    if dist.get_backend() != "gloo":
        raise TrainerError("cpu_shim: a CPU process needs the gloo backend, "
                           f"the process group uses {dist.get_backend()}")
    _installed = True


def _patch_torch_norm() -> None:
    """Megatron's torch norms refuse sequence parallelism only because Apex/TE norms are what mark their weights
    ``sequence_parallel`` (so their grads get summed over TP); the normalisation itself is per token. Build the
    torch norm and mark its weights the same way."""
    import copy

    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    original = WrappedTorchNorm.__new__

    def build(cls, config, *args, **kwargs):
        if not config.sequence_parallel:
            return original(cls, config, *args, **kwargs)
        plain = copy.copy(config)
        plain.sequence_parallel = False
        norm = original(cls, plain, *args, **kwargs)
        for param in norm.parameters():
            param.sequence_parallel = True
        return norm

    WrappedTorchNorm.__new__ = build


def _patch_schedules() -> None:
    """The forward/backward schedules count tokens in ``torch.zeros(..., device="cuda")`` and pipeline p2p calls
    ``torch.cuda.synchronize()``: on CPU the first allocates on the CPU and the second does nothing."""
    import types

    from megatron.core.pipeline_parallel import schedules

    class _CpuTorch(types.ModuleType):
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def zeros(*args, **kwargs):
            if kwargs.get("device") == "cuda":
                kwargs["device"] = "cpu"
            return torch.zeros(*args, **kwargs)

    schedules.torch = _CpuTorch("torch")
    torch.cuda.synchronize = lambda *args, **kwargs: None  # type: ignore[assignment]


def seed_model_parallel_rng(seed: int) -> None:
    """Megatron's model-parallel RNG tracker seeded without CUDA (see the module docstring)."""
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(seed, inference_rng_tracker=True, force_reset_rng=True)
