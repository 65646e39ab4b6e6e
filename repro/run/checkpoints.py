"""Run checkpoints: trainer state + loop state, written to a temp folder and renamed, newest N kept.

Layout: ``checkpoints/step_000025/`` holds ``trainer/`` (weights, optimizer, RNG: written by the trainer),
``loop_state.json`` (step, prompt-sampler position, driver RNG, weight version) and ``metrics.jsonl`` (the log
up to that step). A folder named ``step_*`` only ever appears by an atomic rename of a finished one, so a kill
during a write leaves a ``.tmp-*`` folder that is ignored and cleaned up, and the previous checkpoint stands.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from repro.errors import CheckpointError

STATE_FILE = "loop_state.json"
COMPLETE_MARKER = "COMPLETE"



@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path

    @property
    def trainer_dir(self) -> Path:
        return self.path / "trainer"

    def loop_state(self) -> dict:
        return json.loads((self.path / STATE_FILE).read_text())


def driver_rng_state() -> dict:
    version, internal, gauss = random.getstate()
    return {"python": [version, list(internal), gauss], "torch": torch.get_rng_state().tolist()}


def restore_driver_rng(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


def save_checkpoint(root: str | Path, step: int, trainer, loop_state: dict, metrics_path: Path, keep_last: int) -> Checkpoint:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp-step_{step:06d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    trainer.save(tmp / "trainer")
    (tmp / STATE_FILE).write_text(json.dumps({**loop_state, "step": step}))
    if metrics_path.exists():
        shutil.copyfile(metrics_path, tmp / "metrics.jsonl")
    (tmp / COMPLETE_MARKER).write_text(str(step))
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    prune_checkpoints(root, keep_last)
    return Checkpoint(step, final)


def list_checkpoints(root: str | Path) -> list[Checkpoint]:
    root = Path(root)
    if not root.exists():
        return []
    found = []
    for path in root.glob("step_*"):
        if path.is_dir() and (path / COMPLETE_MARKER).exists() and (path / STATE_FILE).exists():
            found.append(Checkpoint(int(path.name.split("_")[1]), path))
    return sorted(found, key=lambda c: c.step)


def latest_checkpoint(root: str | Path) -> Checkpoint | None:
    checkpoints = list_checkpoints(root)
    return checkpoints[-1] if checkpoints else None


def prune_checkpoints(root: str | Path, keep_last: int) -> None:
    root = Path(root)
    for stale in root.glob(".tmp-step_*"):
        shutil.rmtree(stale, ignore_errors=True)
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old.path)
