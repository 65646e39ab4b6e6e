"""The embedded trainer's full training state on disk, resumable bit for bit.

A state folder holds:
  config.json             the model's Hugging Face config, so the folder also loads as a plain HF checkpoint
  model.safetensors       the model's state dict in the trainer's dtype
  master.safetensors      fp32 master weights (bf16 trainers only; in fp32 the model weights are the masters)
  optimizer.safetensors   AdamW's per-parameter state tensors, keyed ``<param index>.<field>``
  optimizer.json          AdamW's hyper-parameter groups
  rng.safetensors         torch's CPU RNG state
  trainer_state.json      step and update counters, dtype, BF16 GEMM path (repro.train.bf16_gemm), format version

Nothing is pickled, so the folder also passes the checkpoint loader's no-pickle rule and nothing in it can
run code when read.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from repro.recipes.backends import trainer_named
from repro.train.base import StateParts, TrainerError
from repro.train.bf16_gemm import check_resumed_path

FORMAT_VERSION = 1
STATE_FILES = ("config.json", "model.safetensors", "optimizer.safetensors", "optimizer.json", "rng.safetensors",
               "trainer_state.json")


def _tensors(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # safetensors refuses views and shared storage; a contiguous copy of each tensor is always accepted.
    return {name: t.detach().to("cpu").contiguous().clone() for name, t in named.items()}


def _save_optimizer(optimizer: torch.optim.Optimizer, folder: Path) -> None:
    state = optimizer.state_dict()
    tensors = {f"{index}.{key}": value for index, fields in state["state"].items() for key, value in fields.items()}
    save_file(_tensors(tensors), folder / "optimizer.safetensors")
    (folder / "optimizer.json").write_text(json.dumps(state["param_groups"], indent=2) + "\n")


def _load_optimizer(folder: Path) -> dict:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in load_file(folder / "optimizer.safetensors").items():
        index, field = key.split(".", 1)
        state.setdefault(int(index), {})[field] = value
    groups = json.loads((folder / "optimizer.json").read_text())
    for group in groups:
        group["betas"] = tuple(group["betas"])  # JSON has no tuples; AdamW stores betas as one
    return {"state": state, "param_groups": groups}


def save_trainer(trainer: StateParts, directory: str | Path, *, backend: str = "embedded", weights=None,
                 hf_config: bool = True) -> Path:
    """Write a trainer's state (its ``state_parts()``) to ``directory`` via a temporary sibling folder renamed
    into place.

    ``weights`` (default: the model's state dict) and ``hf_config`` (write config.json) let a backend whose
    model is not a Hugging Face module (Megatron) store the same layout; ``backend`` is recorded and checked.
    """
    final = Path(directory).resolve()
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        if hf_config:
            trainer.model.config.to_json_file(tmp / "config.json")
        weights = trainer.model.state_dict() if weights is None else weights
        save_file(_tensors(weights), tmp / "model.safetensors", metadata={"format": "pt"})
        master = trainer.opt.master_state()
        if master:
            save_file(_tensors(master), tmp / "master.safetensors", metadata={"format": "pt"})
        _save_optimizer(trainer.opt.optimizer, tmp)
        save_file({"torch_cpu": torch.get_rng_state()}, tmp / "rng.safetensors")
        meta = {"format": FORMAT_VERSION, "backend": backend, "step": trainer.step, "updates": trainer.updates,
                "dtype": trainer.dtype_name}
        if trainer.bf16_gemm is not None:
            meta["bf16_gemm"] = trainer.bf16_gemm
        (tmp / "trainer_state.json").write_text(json.dumps(meta, indent=2) + "\n")
        tmp.chmod(0o755)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def load_trainer(trainer: StateParts, directory: str | Path, *, backend: str = "embedded",
                 load_weights=None) -> tuple[int, int]:
    """Restore a state written by ``save_trainer`` into a trainer's model and optimizer (its ``state_parts()``:
    same backend, architecture and dtype); returns the saved (step, updates) counters, for the trainer to take.

    ``load_weights(weights, source)`` replaces the strict HF ``load_state_dict`` for other backends.
    """
    folder = Path(directory)
    hf_state = trainer_named(backend, f"load_trainer(backend={backend!r})").hf_state
    required = STATE_FILES if hf_state else tuple(f for f in STATE_FILES if f != "config.json")
    missing = [name for name in required if not (folder / name).is_file()]
    if missing:
        raise TrainerError(f"trainer state {folder} lacks {missing}")
    meta = json.loads((folder / "trainer_state.json").read_text())
    if meta.get("format") != FORMAT_VERSION or meta.get("backend", "embedded") != backend:
        raise TrainerError(
            f"{folder / 'trainer_state.json'}: format {meta.get('format')} "
            f"of backend {meta.get('backend', 'embedded')!r}, "
            f"want format {FORMAT_VERSION} of {backend!r}"
        )
    if meta.get("dtype") != trainer.dtype_name:
        raise TrainerError(
            f"{folder / 'trainer_state.json'}: saved by a {meta.get('dtype')} trainer, this one is {trainer.dtype_name}"
        )
    if trainer.bf16_gemm is not None:
        check_resumed_path(meta.get("bf16_gemm"), trainer.bf16_gemm, str(folder / "trainer_state.json"))
    weights = load_file(folder / "model.safetensors")
    if load_weights is not None:
        load_weights(weights, str(folder / "model.safetensors"))
    else:
        try:
            trainer.model.load_state_dict(weights, strict=True)
        except RuntimeError as err:
            raise TrainerError(f"{folder / 'model.safetensors'} does not fit the model: {err}") from err
    master_path = folder / "master.safetensors"
    if not trainer.opt.shares_storage:
        if not master_path.is_file():
            raise TrainerError(f"{master_path} is missing (a {trainer.dtype_name} trainer keeps fp32 masters)")
        master = load_file(master_path)
        # a ZeRO-1 rank keeps (and saved) the masters of the parameters it owns only
        absent = sorted(set(getattr(trainer.opt, "owned_names", trainer.opt.names)) - set(master))
        if absent:
            raise TrainerError(f"{master_path} lacks {absent[:3]}{'...' if len(absent) > 3 else ''}")
        trainer.opt.load_master_state(master)
    try:
        trainer.opt.optimizer.load_state_dict(_load_optimizer(folder))
    except (ValueError, KeyError) as err:
        raise TrainerError(f"{folder / 'optimizer.safetensors'} does not fit the optimizer: {err}") from err
    torch.set_rng_state(load_file(folder / "rng.safetensors")["torch_cpu"])
    trainer.opt.zero_grad()
    return int(meta["step"]), int(meta["updates"])
