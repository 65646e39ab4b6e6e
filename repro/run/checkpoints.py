"""Run checkpoints: trainer state + loop state, written to a temp folder and renamed, newest N kept.

Layout: ``checkpoints/step_000025/`` holds ``trainer/`` (weights, optimizer, RNG: written by the trainer),
``loop_state.json`` (step, prompt-sampler position, driver RNG, weight version), ``metrics.jsonl`` (the log up
to that step) and ``COMPLETE`` (the step and every file's size, written last, after every file is fsynced).
A folder named ``step_*`` only ever appears by an atomic rename of a finished one, so a kill during a write
leaves a ``.tmp-*`` folder that is ignored and cleaned up, and the previous checkpoint stands; a write that
fails (a full disk) removes its temp folder and raises naming the step. A ``step_*`` folder whose files do not
match its ``COMPLETE`` list (copied in part, truncated) is not taken for a checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from repro.errors import CheckpointError, WorkerError

STATE_FILE = "loop_state.json"
COMPLETE_MARKER = "COMPLETE"
TMP_PREFIX = ".tmp-step_"
OLD_PREFIX = ".old-step_"


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


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _seal(folder: Path, step: int) -> None:
    """fsync every file and folder under ``folder``, then write the marker listing each file's size."""
    sizes = {}
    for path in sorted(folder.rglob("*")):
        _fsync(path)
        if path.is_file():
            sizes[path.relative_to(folder).as_posix()] = path.stat().st_size
    marker = folder / COMPLETE_MARKER
    marker.write_text(json.dumps({"step": step, "files": sizes}, indent=1))
    _fsync(marker)
    _fsync(folder)


def save_checkpoint(root: str | Path, step: int, trainer, loop_state: dict, metrics_path: Path, keep_last: int) -> Checkpoint:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f"{TMP_PREFIX}{step:06d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir()
        trainer.save(tmp / "trainer")
        (tmp / STATE_FILE).write_text(json.dumps({**loop_state, "step": step}))
        if metrics_path.exists():
            shutil.copyfile(metrics_path, tmp / "metrics.jsonl")
        _seal(tmp, step)
    except Exception as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, WorkerError) and err.died:
            raise  # the trainer's process is gone: a restart can go on, so it stays a worker's death
        newest = latest_checkpoint(root)
        free = shutil.disk_usage(root).free / 1e9
        standing = f"the newest complete checkpoint is {newest.path}" if newest else "no complete checkpoint yet"
        raise CheckpointError(f"checkpoint {final.name} not written: {err}; its temp folder {tmp} is removed "
                              f"({free:.2f} GB free there); {standing}") from err
    if final.exists():  # the same step written again: move the old one aside, so one complete copy always exists
        old = root / f"{OLD_PREFIX}{step:06d}"
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    _fsync(root)
    prune_checkpoints(root, keep_last)
    return Checkpoint(step, final)


def check_complete(path: Path) -> str | None:
    """Why the checkpoint folder ``path`` is not complete, or None when it is."""
    marker = path / COMPLETE_MARKER
    if not marker.is_file() or not (path / STATE_FILE).is_file():
        return f"no {COMPLETE_MARKER} marker" if not marker.is_file() else f"no {STATE_FILE}"
    try:
        listed = json.loads(marker.read_text())
    except (OSError, ValueError):
        return f"{COMPLETE_MARKER} is unreadable"
    if not isinstance(listed, dict):  # written before the marker listed files: the step alone
        return None
    for name, size in listed.get("files", {}).items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} is {file.stat().st_size} bytes, {COMPLETE_MARKER} lists {size}"
    return None


def list_checkpoints(root: str | Path) -> list[Checkpoint]:
    root = Path(root)
    if not root.exists():
        return []
    found = [Checkpoint(int(path.name.split("_")[1]), path) for path in root.glob("step_*")
             if path.is_dir() and check_complete(path) is None]
    return sorted(found, key=lambda c: c.step)


def incomplete_checkpoints(root: str | Path) -> list[str]:
    """Each checkpoint folder under ``root`` a resume will not use, with why: a write that did not finish (a run
    killed while writing it) or a ``step_*`` folder whose files do not match its marker."""
    root = Path(root)
    if not root.exists():
        return []
    notes = [f"{path} (a write that did not finish: removed at the next checkpoint)"
             for path in sorted(root.glob(f"{TMP_PREFIX}*"))]
    for path in sorted(root.glob("step_*")):
        why = check_complete(path) if path.is_dir() else "not a folder"
        if why:
            notes.append(f"{path} ({why})")
    return notes


def latest_checkpoint(root: str | Path) -> Checkpoint | None:
    checkpoints = list_checkpoints(root)
    return checkpoints[-1] if checkpoints else None


def prune_checkpoints(root: str | Path, keep_last: int) -> None:
    root = Path(root)
    for stale in [*root.glob(f"{TMP_PREFIX}*"), *root.glob(f"{OLD_PREFIX}*")]:
        shutil.rmtree(stale, ignore_errors=True)
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old.path)
