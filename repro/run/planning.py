"""The one plan every engine makes of a run directory before anything starts (``RunPlan``): a new run, a fresh
start, or a resume from the engine's newest usable checkpoint, with what that keeps and drops of the log.

Each engine differs only in where its checkpoints are and how it knows one is usable (repro's own are verified by
content, LumenRL's and verl's by their own layouts), and in whether it records a finished run beside them; so an
engine passes those two readers and the decisions are written once here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal

from repro.run.folder import plan_fresh
from repro.run.metrics_log import MetricsLog
from repro.run.plan import RunPlan

if TYPE_CHECKING:
    from repro.run.checkpoints import Checkpoint

# the newest usable checkpoint, and the folders passed over, each with why
NewestCheckpoint = Callable[[], "tuple[Checkpoint | None, list[str]]"]


def plan_run(run_dir: str | Path, steps: int, newest: NewestCheckpoint, resume: bool | Literal["auto"] = False,
             fresh: bool | str = False, finished: "Callable[[], Checkpoint | None] | None" = None) -> RunPlan:
    """Resume or not (``"auto"``: resume when ``run_dir`` already holds a log, as a re-run of ``make repro``
    does), from which checkpoint (``newest()``), and which train rows of the log that keeps and which steps it
    drops to recompute; ``fresh`` (repro.run.folder): start over, refused now if the folder is not one it may
    empty; ``finished()``: the engine's record that the run ended at a step (None: it keeps none). Reads only."""
    run_dir = Path(run_dir)
    log = run_dir / "metrics.jsonl"
    if fresh:
        plan_fresh(run_dir, fresh)  # refused now, before anything starts, when fresh may not remove the folder
        return RunPlan(run_dir, False, fresh, None, False, [], [])
    if not (log.exists() if resume == "auto" else bool(resume)):
        return RunPlan(run_dir, False, False, None, False, [], [])
    done = finished() if finished is not None else None
    if done is not None and done.step >= steps:
        return RunPlan(run_dir, True, False, done, True, _train_rows(log), [])
    checkpoint, ignored = newest()
    if checkpoint is None:
        return RunPlan(run_dir, True, False, None, False, [], [], ignored)
    rows = _train_rows(log)
    return RunPlan(run_dir, True, False, checkpoint, checkpoint.step >= steps,
                   [r for r in rows if r["step"] <= checkpoint.step],
                   sorted({r["step"] for r in rows if r["step"] > checkpoint.step}), ignored)


def _train_rows(log: Path) -> list[dict]:
    return [r for r in MetricsLog(log).rows() if r.get("kind") == "train"]
