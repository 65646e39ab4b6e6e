"""The engine seam: everything the rest of repro needs from whoever runs a recipe's RL loop, in one typed record.

An engine is a package and one row of ``repro.recipes.backends.ENGINES``. The row holds what recipe validation and
the analysis may read without importing the engine's launch code: its capabilities, the checks of what it cannot run
(``problems``), what the analysis reads beside a run's metrics.jsonl (``about_run_dir``: key origins, the step-time
convention) and its caveats for the comparison with AMD's numbers (``caveats``), each "module:function", and the
kind of run source its own logs are. It names the engine's ``EngineSeam`` ("module:attribute"), imported only when
a run, a launch or a dry run needs it. ``repro.engines`` (run), ``repro.commands.launch``
(launch and dry run) and ``repro.analysis`` (caveats, what a run folder holds) ask the seam; none of them names an
engine. The three engines: ``repro.run.engine`` (our own loop), ``repro.lumenrl.seam`` (AMD's LumenRL),
``repro.verl.seam`` (verl).

A third engine is: its package with an ``EngineSeam``, its row in ``ENGINES``, its section in the recipe schema
(where it is installed, its site settings) and ``engine``'s Literal there.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal, Protocol

from repro.recipes.backends import ENGINES

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe
    from repro.run.checkpoints import Checkpoint
    from repro.run.plan import RunOutcome, RunPlan
    from repro.run.state import Progress


class PlanRun(Protocol):
    def __call__(self, recipe: "Recipe", run_dir: str | Path, resume: bool | Literal["auto"] = False,
                 fresh: bool | str = False) -> "RunPlan": ...


class RunPlanned(Protocol):
    def __call__(self, recipe: "Recipe", plan: "RunPlan", *, in_process: bool = False,
                 progress: "Progress" = ..., say: Callable[[str], None] = print) -> "RunOutcome": ...


class DryRun(Protocol):
    def __call__(self, recipe: "Recipe", run_dir: Path, *, simulate: bool, timeout_s: float,
                 say: Callable[[str], None]) -> None: ...


@dataclass(frozen=True)
class EngineSeam:
    """What one engine does for repro. Every callable reads or writes only what its docstring line says."""

    plan: PlanRun            # the run directory read: resume or not, from which checkpoint; changes nothing
    run: RunPlanned          # the plan run to the recipe's last step (its config written, launched, log streamed)
    dry_run: DryRun          # `repro launch --dry-run`: placement, config, command, memory budget; starts nothing
    check_launch: Callable[["Recipe"], None]  # raises, naming each, what this machine lacks to start it
    latest_checkpoint: Callable[["Recipe", Path], "Checkpoint | None"]  # the resume point of a run directory
    write_config: Callable[["Recipe", Path, bool], Path] | None = None  # (recipe, run_dir, resume) -> its config file


def load_seam(engine: str) -> EngineSeam:
    """The seam of ``engine`` (a recipe's ``engine`` value), imported now."""
    module, _, attribute = ENGINES[engine].seam.partition(":")
    return getattr(importlib.import_module(module), attribute)


def seam_of(recipe: "Recipe") -> EngineSeam:
    return load_seam(recipe.engine)
