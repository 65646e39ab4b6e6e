"""Who runs a recipe's RL loop, chosen in this one table from ``recipe.engine``: repro's own loop
(``repro.run.start``) or AMD's LumenRL (``repro.lumenrl.run``). The two engines stand side by side below this module
and import nothing of each other; both plan a run directory into a ``RunPlan`` and hand back a ``RunOutcome``
(``repro.run.plan``).

What each engine can do is declared beside the trainer and rollout backends' (``repro.recipes.backends.ENGINES``,
read by recipe validation, the sinks and the analysis); each entry here carries it.

``run_recipe`` is the one entry point to a run: ``repro run``, ``repro smoke``, ``repro launch``, the ablations and
the notebooks 02/03 all call it (or ``plan_run`` then ``run_planned``, to show the plan first).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Protocol

from repro.lumenrl.run import plan_lumenrl_run, run_lumenrl
from repro.recipes.backends import ENGINES as CAPABILITIES, EngineCapabilities
from repro.recipes.schema import Recipe
from repro.run.plan import RunOutcome, RunPlan
from repro.run.start import plan_repro_run, run_repro
from repro.run.state import Progress, no_progress


class PlanRun(Protocol):
    def __call__(self, recipe: Recipe, run_dir: str | Path, resume: bool | Literal["auto"] = False,
                 fresh: bool | str = False) -> RunPlan: ...


class RunPlanned(Protocol):
    def __call__(self, recipe: Recipe, plan: RunPlan, *, in_process: bool = False, progress: Progress = no_progress,
                 say: Callable[[str], None] = print) -> RunOutcome: ...


@dataclass(frozen=True)
class Engine:
    plan: PlanRun     # reads the run directory (resume from which checkpoint), changes nothing
    run: RunPlanned   # runs the plan to the recipe's last step
    capabilities: EngineCapabilities


ENGINES: dict[str, Engine] = {
    "repro": Engine(plan_repro_run, run_repro, CAPABILITIES["repro"]),
    "lumenrl": Engine(plan_lumenrl_run, run_lumenrl, CAPABILITIES["lumenrl"]),
}


def plan_run(recipe: Recipe, run_dir: str | Path, resume: bool | Literal["auto"] = False,
             fresh: bool | str = False) -> RunPlan:
    """Resume or not (``"auto"``: resume when ``run_dir`` already holds a log, as a re-run of ``make repro``
    does), from which checkpoint, and what that keeps and drops of the log. Reads, changes nothing."""
    return ENGINES[recipe.engine].plan(recipe, run_dir, resume, fresh)


def run_planned(recipe: Recipe, plan: RunPlan, *, in_process: bool = False, progress: Progress = no_progress,
                say: Callable[[str], None] = print) -> RunOutcome:
    """``run_recipe`` for a plan already made (a notebook shows it first, e.g. to seed its live plot)."""
    return ENGINES[recipe.engine].run(recipe, plan, in_process=in_process, progress=progress, say=say)


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
