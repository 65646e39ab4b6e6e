"""Where a process's tensors and collectives live, decided in one place for the trainer, the sync and the rollout.

* ``current_accelerator()``: the device this process computes on -- the GPU torch's current device names (CUDA,
  or ROCm through torch's cuda API), as megatron-core allocates on it (``device=torch.cuda.current_device()``).
* ``collective_device(backend)``: where a collective's tensors must be. NCCL (RCCL on ROCm) accepts only device
  tensors (``ProcessGroupNCCL``: "Tensors must be CUDA and dense"); gloo takes host tensors. Every tensor repro
  hands to a collective -- counters, headers, buckets -- is made there, never moved by the transport.
* ``settle()``: wait for every stream of this device. What the trainer updated on its own streams (megatron's
  offloaded optimizer copies parameters back with non-blocking copies on a side stream) must have landed before a
  sync reads the weights on another stream (vLLM's packed producer packs on streams of its own that never wait
  on the default one).
* ``local_device_index(...)``: which visible GPU a trainer rank takes. Under Ray an actor with ``num_gpus=1`` sees
  only its own GPU (``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES`` set to Ray's id for it), so the node-local
  rank is not a device index there: the index is where Ray's id stands among the visible ones.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import torch

from repro.errors import ReproError

# the variables that restrict which GPUs a process sees, in the order torch's ROCm build reads them
VISIBLE_DEVICES_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


class DeviceError(ReproError):
    """A process cannot tell, or does not have, the device it was given."""


def current_accelerator() -> torch.device:
    """This process's current GPU (what megatron-core allocates on)."""
    return torch.device(torch.cuda.current_device())


def collective_device(backend: str) -> torch.device:
    """Where tensors handed to a collective of ``backend`` must be: the current GPU for NCCL/RCCL, else the host."""
    return current_accelerator() if backend == "nccl" else torch.device("cpu")


def settle() -> None:
    """Wait until every stream of this process's GPU has finished (nothing to wait for on a CPU)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def visible_devices(env: Mapping[str, str]) -> list[str] | None:
    """The GPU ids this process is restricted to, or None when no variable restricts it."""
    for name in VISIBLE_DEVICES_VARS:
        value = env.get(name)
        if value is not None:
            return [v.strip() for v in value.split(",") if v.strip()]
    return None


def local_device_index(env: Mapping[str, str], assigned: Sequence[str], device_count: int) -> int:
    """The index (among the devices this process sees) of the GPU a trainer rank should take.

    ``assigned``: the GPU ids Ray gave this actor (``ray.get_accelerator_ids()["GPU"]``; empty outside Ray). With
    one assigned, its position among the visible ids (Ray sets ``CUDA_VISIBLE_DEVICES`` to exactly it, so 0; with
    ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` nothing is hidden and the index is the id itself). Outside Ray
    (torchrun), ``LOCAL_RANK``. Raises ``DeviceError`` naming the variables when the index is not a visible GPU.
    """
    visible = visible_devices(env)
    if len(assigned) > 1:
        raise DeviceError(f"this trainer rank was given {len(assigned)} GPUs by Ray ({list(assigned)}); one rank "
                          "drives one GPU")
    if assigned:
        gpu = str(assigned[0])
        if visible is None:
            index, why = int(gpu), f"Ray's GPU id {gpu} (no *_VISIBLE_DEVICES set)"
        elif gpu in visible:
            index, why = visible.index(gpu), f"Ray's GPU id {gpu} among visible {','.join(visible)}"
        else:
            raise DeviceError(f"Ray gave this rank GPU {gpu}, but the process sees only {','.join(visible)} "
                              f"({_visible_text(env)})")
    else:
        index, why = int(env.get("LOCAL_RANK", "0")), f"LOCAL_RANK={env.get('LOCAL_RANK', '0 (unset)')}"
    if not 0 <= index < device_count:
        raise DeviceError(f"{why} picks GPU index {index}, but this process sees {device_count} GPU(s) "
                          f"({_visible_text(env)})")
    return index


def _visible_text(env: Mapping[str, str]) -> str:
    shown = [f"{n}={env[n]}" for n in VISIBLE_DEVICES_VARS if n in env]
    return ", ".join(shown) or "no *_VISIBLE_DEVICES set"


def ray_assigned_gpus() -> list[str]:
    """The GPU ids Ray assigned to the calling actor; [] outside a Ray worker."""
    try:
        import ray
    except ImportError:
        return []
    if not ray.is_initialized():
        return []
    return [str(i) for i in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]


def this_process_device_index() -> int:
    """``local_device_index`` for this process: its environment, Ray's assignment, torch's device count."""
    return local_device_index(os.environ, ray_assigned_gpus(), torch.cuda.device_count())
