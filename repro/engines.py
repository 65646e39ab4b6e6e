"""Who runs a recipe's RL loop, chosen from ``recipe.engine`` in one table (``repro.recipes.backends.ENGINES``):
repro's own loop (``repro.run.engine``), AMD's LumenRL (``repro.lumenrl.seam``) or verl (``repro.verl.seam``). The
engines stand side by side below this module and import nothing of each other; each plans a run directory into a
``RunPlan`` and hands back a ``RunOutcome`` (``repro.run.plan``) through its seam (``repro.engine_seam``).

``run_recipe`` is the one entry point to a run: ``repro run``, ``repro smoke``, ``repro launch``, the ablations and
the notebooks 02/03 all call it (or ``plan_run`` then ``run_planned``, to show the plan first).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Literal

from repro.engine_seam import seam_of
from repro.recipes.schema import Recipe
from repro.run.plan import RunOutcome, RunPlan
from repro.run.state import Progress, no_progress


def plan_run(recipe: Recipe, run_dir: str | Path, resume: bool | Literal["auto"] = False,
             fresh: bool | str = False) -> RunPlan:
    """Resume or not (``"auto"``: resume when ``run_dir`` already holds a log, as a re-run of ``make repro``
    does), from which checkpoint, and what that keeps and drops of the log. Reads, changes nothing."""
    return seam_of(recipe).plan(recipe, run_dir, resume, fresh)


def run_planned(recipe: Recipe, plan: RunPlan, *, in_process: bool = False, progress: Progress = no_progress,
                say: Callable[[str], None] = print) -> RunOutcome:
    """``run_recipe`` for a plan already made (a notebook shows it first, e.g. to seed its live plot)."""
    return seam_of(recipe).run(recipe, plan, in_process=in_process, progress=progress, say=say)


def run_recipe(recipe: Recipe, run_dir: str | Path, *, in_process: bool = False,
               resume: bool | Literal["auto"] = False, fresh: bool | str = False, progress: Progress = no_progress,
               say: Callable[[str], None] = print) -> RunOutcome:
    """Run (or resume) ``recipe`` in ``run_dir``; ``progress(step, row)`` is called after every step.

    resume: True, False, or ``"auto"`` (resume when ``run_dir`` already holds a log). fresh: start ``run_dir``
    over, removing the run's own files after saying which: True for a smoke run's folder (at most 3 steps; the
    smoke run is a throwaway check), ``"delete-run"`` for a longer run's; a folder that is not a run's is refused
    (repro.run.folder)."""
    return run_planned(recipe, plan_run(recipe, run_dir, resume, fresh), in_process=in_process, progress=progress,
                       say=say)
