"""verl's checkpoints as our resume points, from folder names and files only (nothing is unpickled).

verl 0.9.1 (``trainer/ppo/v1/trainer_base.py`` ``_save_checkpoint``) saves after step N into
``<default_local_dir>/global_step_N/``: ``actor/`` (the Megatron state), then ``data.pt`` (the dataloader), then,
last, writes N into ``<default_local_dir>/latest_checkpointed_iteration.txt``. So a checkpoint is complete when its
``actor/`` and ``data.pt`` exist and the tracker has reached N: a ``global_step_N`` newer than the tracker was being
written when the run stopped. verl's own ``resume_mode=auto`` trusts the tracker alone and silently starts from
scratch when it is missing; we resume with ``resume_mode=resume_path`` and the folder chosen here, and refuse to
resume (rather than start over) when folders exist but none is complete.
"""

from __future__ import annotations

import re
from pathlib import Path

from repro.run.checkpoints import Checkpoint

TRACKER = "latest_checkpointed_iteration.txt"
STEP_FOLDER = re.compile(r"^global_step_(\d+)$")


def tracked_step(root: Path) -> int | None:
    """The step verl's tracker names, or None (no tracker, or text that is not a step number)."""
    tracker = Path(root) / TRACKER
    if not tracker.is_file():
        return None
    text = tracker.read_text(encoding="utf-8", errors="replace").strip()
    return int(text) if text.isdigit() else None


def step_folders(root: Path) -> list[tuple[int, Path]]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted((int(m[1]), p) for p in root.iterdir() if (m := STEP_FOLDER.match(p.name)) and p.is_dir())


def incomplete(root: Path) -> list[str]:
    """Each ``global_step_N`` a resume must not use, with why."""
    tracked = tracked_step(root)
    notes = []
    for step, folder in step_folders(root):
        missing = [name for name in ("actor", "data.pt") if not (folder / name).exists()]
        if missing:
            notes.append(f"{folder.name} (no {' or '.join(missing)})")
        elif tracked is None or step > tracked:
            notes.append(f"{folder.name} (written after the tracker {TRACKER} was last updated"
                         + (f", at step {tracked})" if tracked is not None else ": there is none)"))
    return notes


def latest_verl_checkpoint(root: Path) -> Checkpoint | None:
    """The newest complete checkpoint (module docstring), or None."""
    tracked = tracked_step(root)
    if tracked is None:
        return None
    complete = [(step, folder) for step, folder in step_folders(root) if step <= tracked
                and (folder / "actor").is_dir() and (folder / "data.pt").is_file()]
    return Checkpoint(complete[-1][0], complete[-1][1]) if complete else None
