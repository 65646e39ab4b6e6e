"""The run folder of an engine that runs as a program of its own (LumenRL, verl): what repro does to it before the
program starts and after it has planned the resume, written once for both.

Before the program starts: the folder is checked (no link out of it, not someone else's), a resume's recipe is
compared with the run's record, ``fresh`` removes the run's own entries, a new run does not write over a log, and
the engine's folders are made. Once the engine has checked its own checkpoints: the log is cut back to the step
the program resumes from, a resume that changed a RESUMABLE field is recorded (recipe.yaml, a ``resume`` row),
and the markers of the last attempt (its finished step, its key origins) are cleared. The engine keeps what
differs: which program, its checkpoint folder's rules, its tracking.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from repro.errors import ReproError
from repro.recipes import dump_recipe
from repro.recipes.resume import RECIPE_FILE, resume_changes
from repro.recipes.schema import Recipe
from repro.run.folder import check_run_folder, clear_for_fresh, record_resume
from repro.run.metrics_log import MetricsLog
from repro.run.plan import RunPlan


def open_program_run_dir(recipe: Recipe, plan: RunPlan, say: Callable[[str], None], work: Path,
                         log: Path) -> tuple[MetricsLog, dict[str, list]]:
    """The run folder checked and made (``work``: the engine's folder, ``log``: its program's log file, both
    inside the run folder); returns the run's log and the RESUMABLE fields a resume changes ({field: [old, new]};
    any other difference is refused by ``resume_changes``)."""
    run_dir = plan.run_dir
    check_run_folder(run_dir, plan.resume or bool(plan.fresh))  # no link out of it, not someone's folder
    stored, changes = run_dir / RECIPE_FILE, {}
    if plan.resume and stored.is_file():  # the recipe the run started with (repro.recipes.resume)
        changes = resume_changes(stored, recipe)
    if plan.fresh:
        clear_for_fresh(run_dir, plan.fresh, say)  # says what it removes, then removes only the run's own entries
    metrics = MetricsLog(run_dir / "metrics.jsonl")
    if not plan.resume and metrics.path.exists():
        raise ReproError(f"run dir {run_dir} already holds a run (metrics.jsonl); pass --resume to continue it, "
                         "or choose another --run-dir")
    try:
        work.mkdir(parents=True, exist_ok=True)
        log.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ReproError(f"run dir {run_dir}: cannot write there ({err.strerror or err})") from None
    return metrics, changes


def record_recipe(recipe: Recipe, plan: RunPlan) -> None:
    """recipe.yaml for a new run (or a resumed one that has none); a resume's changes go in with its resume row
    (``settle_log``)."""
    stored = plan.run_dir / RECIPE_FILE
    if not plan.resume or not stored.is_file():
        dump_recipe(recipe, stored)


def settle_log(recipe: Recipe, plan: RunPlan, metrics: MetricsLog, changes: dict[str, list],
               say: Callable[[str], None], finished: Path, origins: Path) -> int:
    """The log as it stood at the checkpoint the program resumes from, a ``resume`` row for what the resume
    changed, the last attempt's markers cleared (``finished``: the step it ended at; ``origins``: our key -> the
    program's, kept on a resume); returns the step the program starts from (0: a new run)."""
    start_step = plan.checkpoint.step if plan.resume and plan.checkpoint else 0
    if plan.resume and metrics.path.exists():
        metrics.truncate_after(start_step)
    record_resume(recipe, plan.run_dir, metrics, start_step, changes, say)
    finished.unlink(missing_ok=True)
    if not start_step:
        origins.unlink(missing_ok=True)
    return start_step
