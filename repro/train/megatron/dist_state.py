"""The Megatron trainer's state through ``megatron.core.dist_checkpointing`` (torch DCP underneath): one folder for
all ranks, every tensor saved as a shard of its global (world-size-1) tensor, so a run resumes bit for bit on the
same layout and reshards onto another one (TP 2 -> TP 1 is tested on CPU). What reshards: the model (megatron's
own ``sharded_state_dict``) and the optimizer state -- the project's AdamW per parameter, megatron's distributed
optimizer in its ``fully_reshardable`` format (``repro.train.megatron.optimizers.DISTRIB_OPTIM_SHARDING``) --
onto any TP/PP/EP/DP layout; the RNG states do not (below). ``trainer_state.json`` records the optimizer format.

    <directory>/trainer_state.json   format 2, backend "megatron": counters, dtype, the layout that wrote it
    <directory>/dist/                megatron's checkpoint: common.pt, metadata.json, DCP's .metadata and *.distcp

What ``dist/`` holds, by ShardedTensor key:
  ``<model key>``                     the model's own ``sharded_state_dict()`` (TP/EP/PP-aware, megatron's keys)
  ``optimizer.<field>.<model key>``   the project AdamW's fp32 ``master`` (bf16 trainers) and ``exp_avg`` /
                                      ``exp_avg_sq``, each sharded exactly as its parameter
                                      (``make_sharded_optimizer_tensor``); under ZeRO-1 its owner writes it. On a
                                      GPU the optimizer is megatron's, which brings its own ``sharded_state_dict``.
  ``rng.<name>``                      this rank's RNG states as row ``rank`` of a ``[world, n]`` tensor: torch's CPU
                                      state, the CUDA state when there is a device, and every state of megatron's
                                      tensor-parallel RNG tracker (``get_cuda_rng_tracker().get_states()``).

RNG states are per rank, so they are restored only onto the layout that wrote them; a resharded load keeps the
new world's seeded RNG (the trainer's forward and update draw no random numbers) and says so in ``resharded_from``.

Nothing is cloned to host memory here: dist_checkpointing writes the live tensors (it stages GPU tensors to host
per write bucket itself). What it reads back: ``common.pt`` and byte items through ``torch.load``, which defaults
to ``weights_only=True`` (torch >= 2.6, checked at import), and DCP's ``.metadata`` with a bare ``pickle.load``
-- so ``check_metadata`` reads that file first with an unpickler that builds only DCP's metadata classes and
refuses anything else, naming the file.

The format before this one (``repro.train.trainer_state``: one safetensors folder per rank, ``rank-NNNNN`` above
world size 1) still loads, onto the same layout only (``load_old_format``).
"""

from __future__ import annotations

import io
import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from repro.train.base import TrainerError

FORMAT_VERSION = 2
DIST_DIR = "dist"
STATE_FILE = "trainer_state.json"

# what DCP's .metadata pickles (torch 2.13): the dataclasses and enums these modules define, torch sizes and dtypes
_METADATA_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.planner",
                     "torch.distributed.checkpoint.filesystem")
_METADATA_GLOBALS = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict")}


def _torch_load_is_weights_only() -> bool:
    import inspect
    import os

    from torch.serialization import _default_to_weights_only

    default = inspect.signature(torch.load).parameters["weights_only"].default
    # torch >= 2.6: None resolves to True (no pickle_module given) unless this variable forces full unpickling
    forced_off = os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0") not in ("0", "")
    return not forced_off and (default is True or (default is None and _default_to_weights_only(None)))


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if "." not in name:  # a dotted name would reach whatever the module imported (os.system, ...)
            if (module, name) in _METADATA_GLOBALS:
                return super().find_class(module, name)
            if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
                return getattr(torch, name)
            found = super().find_class(module, name) if module in _METADATA_MODULES else None
            if isinstance(found, type) and found.__module__ == module:
                return found
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a DCP checkpoint's metadata")


def check_metadata(checkpoint_dir: Path) -> None:
    """Unpickle ``checkpoint_dir/.metadata`` with only DCP's metadata classes allowed (DCP itself then reads it
    with a bare ``pickle.load``); a file that names any other global is refused before DCP opens it."""
    path = checkpoint_dir / ".metadata"
    if not path.is_file():
        raise TrainerError(f"{checkpoint_dir}: no .metadata; not a complete dist checkpoint")
    try:
        _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
    except (pickle.UnpicklingError, AttributeError, EOFError, ValueError) as err:
        raise TrainerError(f"{path}: refused, it is not plain DCP metadata ({err}); nothing was loaded") from None


def layout() -> dict[str, int]:
    """The live parallel layout: what must match for RNG states (and the old per-rank format) to be restored."""
    from megatron.core import parallel_state as ps

    return {"world_size": dist.get_world_size(),
            "tensor_model_parallel_size": ps.get_tensor_model_parallel_world_size(),
            "pipeline_model_parallel_size": ps.get_pipeline_model_parallel_world_size(),
            "expert_model_parallel_size": ps.get_expert_model_parallel_world_size(),
            "expert_tensor_parallel_size": ps.get_expert_tensor_parallel_world_size(),
            "data_parallel_size": ps.get_data_parallel_world_size()}


def rng_states() -> dict[str, torch.Tensor]:
    """This rank's RNG states by name: torch's CPU state, the CUDA one when a device is present, megatron's tracker."""
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    states = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state()
    # the tracker's states are CUDA generator states (CPU byte tensors); on CPU the shim's tracker holds none
    states.update({f"tracker.{name}": state for name, state in get_cuda_rng_tracker().get_states().items()})
    return states


def set_rng_states(states: dict[str, torch.Tensor]) -> None:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    torch.set_rng_state(states["cpu"])
    if "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"])
    tracker = {name.removeprefix("tracker."): s for name, s in states.items() if name.startswith("tracker.")}
    if tracker:
        get_cuda_rng_tracker().set_states(tracker)


def _rng_sharded(states: dict[str, torch.Tensor]) -> dict[str, Any]:
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    rank, world = dist.get_rank(), dist.get_world_size()
    return {name: ShardedTensor.from_rank_offsets(f"rng.{name}", state.unsqueeze(0), (0, rank, world), replica_id=0)
            for name, state in states.items()}


def save_state(trainer, directory: str | Path) -> Path:
    """Write ``trainer``'s state to ``directory`` (collective: every rank calls it with the same path, which all
    ranks must see). Written into a hidden sibling, renamed into place by rank 0 once every rank has written."""
    from megatron.core import dist_checkpointing

    final = Path(directory).resolve()
    tmp = final.parent / f".{final.name}.tmp-dist"
    rank0 = dist.get_rank() == 0
    if rank0:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / DIST_DIR).mkdir(parents=True)
    dist.barrier()
    try:
        model_sd = trainer.model.sharded_state_dict()
        sharded = {"model": model_sd, "optimizer": trainer.opt.sharded_state_dict(model_sd),
                   "rng": _rng_sharded(rng_states())}
        dist_checkpointing.save(sharded, str(tmp / DIST_DIR))  # ends with a barrier
        adam_step = trainer.opt.adam_step()
        if rank0:
            meta = {"format": FORMAT_VERSION, "backend": "megatron", "step": trainer.step, "updates": trainer.updates,
                    "dtype": trainer.dtype_name, "optimizer": type(trainer.opt).__name__, "adam_step": adam_step,
                    "optimizer_format": trainer.opt.checkpoint_format,
                    "layout": layout(),
                    "rng": sorted(rng_states())}
            (tmp / STATE_FILE).write_text(json.dumps(meta, indent=2) + "\n")
            if final.exists():
                shutil.rmtree(final)
            tmp.rename(final)
    except BaseException:
        if rank0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    dist.barrier()
    return final


def read_meta(folder: Path) -> dict | None:
    """``trainer_state.json`` of a format-2 state, or None when ``folder`` holds the old per-rank format."""
    path = folder / STATE_FILE
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
    except ValueError as err:
        raise TrainerError(f"{path}: not valid JSON ({err})") from None
    return meta if meta.get("format") == FORMAT_VERSION else None


def load_state(trainer, folder: Path, meta: dict) -> None:
    """Restore a format-2 state into ``trainer`` (collective), resharding model and optimizer state when the
    layout differs from the one that saved it."""
    from megatron.core import dist_checkpointing

    if meta.get("backend") != "megatron":
        raise TrainerError(f"{folder / STATE_FILE}: backend {meta.get('backend')!r}, want 'megatron'")
    if meta.get("dtype") != trainer.dtype_name:
        raise TrainerError(f"{folder / STATE_FILE}: saved by a {meta.get('dtype')} trainer, "
                           f"this one is {trainer.dtype_name}")
    if meta.get("optimizer") != type(trainer.opt).__name__:
        raise TrainerError(f"{folder / STATE_FILE}: optimizer state of {meta.get('optimizer')}, this trainer steps "
                           f"{type(trainer.opt).__name__} (megatron's on a GPU, the project's AdamW on CPU: "
                           "repro.train.megatron.optimizers); their states do not convert")
    saved_format = meta.get("optimizer_format", trainer.opt.checkpoint_format)  # absent before it was recorded
    if saved_format != trainer.opt.checkpoint_format:
        raise TrainerError(f"{folder / STATE_FILE}: optimizer state saved as {saved_format!r}, this trainer reads "
                           f"{trainer.opt.checkpoint_format!r}")
    check_metadata(folder / DIST_DIR)
    same_layout = meta.get("layout") == layout()
    model_sd = trainer.model.sharded_state_dict()
    sharded = {"model": model_sd, "optimizer": trainer.opt.sharded_state_dict(model_sd, is_loading=True,
                                                                              adam_step=meta["adam_step"])}
    current = rng_states()
    if same_layout:
        if sorted(current) != meta.get("rng"):
            raise TrainerError(f"{folder / STATE_FILE}: RNG states {meta.get('rng')}, "
                               f"this process has {sorted(current)}")
        sharded["rng"] = _rng_sharded({name: torch.empty_like(s) for name, s in current.items()})
    try:
        loaded = dist_checkpointing.load(sharded, str(folder / DIST_DIR))
    except Exception as err:  # megatron raises CheckpointingException, DCP its CheckpointException, both naming keys
        raise TrainerError(f"{folder / DIST_DIR} does not fit this trainer: {err}") from err
    missing, unexpected = trainer.model.load_state_dict(loaded["model"], strict=False)
    if missing or [k for k in unexpected if not k.endswith("_extra_state")]:
        raise TrainerError(f"{folder / DIST_DIR}: model keys missing {missing[:3]}, unexpected {unexpected[:3]}")
    trainer.opt.load_sharded_state_dict(loaded["optimizer"], adam_step=meta["adam_step"])
    if same_layout:
        set_rng_states({name: t.squeeze(0) for name, t in loaded["rng"].items()})
    trainer.resharded_from = None if same_layout else meta.get("layout")
    trainer.step, trainer.updates = int(meta["step"]), int(meta["updates"])
    trainer.opt.zero_grad()


if not _torch_load_is_weights_only():  # dist_checkpointing's torch.load calls rely on the safe default
    raise ImportError("repro.train.megatron.dist_state needs torch.load to default to weights_only=True "
                      "(torch >= 2.6, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD unset)")
