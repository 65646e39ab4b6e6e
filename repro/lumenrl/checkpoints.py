"""LumenRL's checkpoints as our resume points, read from the folder names and its tracker file only.

LumenRL's Ray-controller path (``lumenrl/trainer/callbacks.py``, ``rl_trainer.py`` on dev/dsv4-grpo @2232f554) saves
after step N when ``N % save_steps == 0``: the actor shards to ``<checkpoint_dir>/global_step_N/actor/``, then
``global_step_N/checkpoint_N.pt`` (step and metrics; a torch pickle, which we never open), then writes N to
``<checkpoint_dir>/latest_checkpointed_iteration.txt``, and prunes to the newest ``save_total_limit`` folders.
Resuming, it takes the tracker's N if ``global_step_N/actor/`` exists, otherwise the highest ``global_step_*`` with
an ``actor/`` folder, and its next log line is ``step=N+1``.

:func:`latest_lumenrl_checkpoint` applies the same rule, so the step our log is cut back to is the step LumenRL
continues from.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

from repro.run.checkpoints import Checkpoint

TRACKER = "latest_checkpointed_iteration.txt"
STEP_FOLDER = re.compile(r"^global_step_(\d+)$")


class CheckpointWarning(UserWarning):
    """LumenRL's checkpoint tracker holds something that is not a step number."""


def lumenrl_checkpoints(root: str | Path) -> list[Checkpoint]:
    """Every ``global_step_N/`` with an ``actor/`` folder, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [Checkpoint(int(m[1]), p) for p in root.iterdir()
             if (m := STEP_FOLDER.match(p.name)) and (p / "actor").is_dir()]
    return sorted(found, key=lambda c: c.step)


def tracked_step(root: str | Path) -> int | None:
    """The step ``latest_checkpointed_iteration.txt`` names (None: no tracker). Text that is not a step number is
    reported with a warning naming the file and treated as no tracker, as LumenRL treats it (it scans the folders)."""
    tracker = Path(root) / TRACKER
    if not tracker.is_file():
        return None
    text = tracker.read_text(encoding="utf-8", errors="replace").strip()
    if not text.isdigit():
        warnings.warn(f"{tracker}: expected a step number, found {text[:40]!r}; using the newest global_step_* "
                      "folder, as LumenRL does", CheckpointWarning, stacklevel=2)
        return None
    return int(text)


def latest_lumenrl_checkpoint(root: str | Path) -> Checkpoint | None:
    """The checkpoint LumenRL resumes from (see the module docstring), or None."""
    root = Path(root)
    step = tracked_step(root)
    if step is not None and (root / f"global_step_{step}" / "actor").is_dir():
        return Checkpoint(step, root / f"global_step_{step}")
    checkpoints = lumenrl_checkpoints(root)
    return checkpoints[-1] if checkpoints else None
