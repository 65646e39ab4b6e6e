"""AMD's LumenRL as an engine (``engine: lumenrl``): its seam (``repro.engine_seam``), made of this package's
functions. The config writer is ``run.prepare_config``, the dry run ``run.describe_launch`` with the trainer's
memory budget, the launch check ``launch.checkout_problems``, the resume point ``checkpoints``' rule; what the
analysis reads of a streamed run is ``repro.analysis.lumenrl_origins`` (named in the engine table)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from repro.engine_seam import EngineSeam
from repro.lumenrl.checkpoints import latest_lumenrl_checkpoint
from repro.lumenrl.launch import LumenRLError, checkout_problems
from repro.lumenrl.run import checkpoint_root, describe_launch, plan_lumenrl_run, prepare_config, run_lumenrl
from repro.recipes.schema import Recipe
from repro.run.checkpoints import Checkpoint


def dry_run(recipe: Recipe, run_dir: Path, *, simulate: bool, timeout_s: float, say: Callable[[str], None]) -> None:
    """The LumenRL config written from the recipe beside the published one, the environment, the command and the
    trainer's memory budget (LumenRL places its own workers: nothing to simulate)."""
    from repro.run.launch import format_memory_budget

    say(describe_launch(recipe, run_dir))
    say(format_memory_budget(recipe))


def check_launch(recipe: Recipe) -> None:
    problems = checkout_problems(recipe)
    if problems:
        raise LumenRLError(f"recipe {recipe.name} cannot start LumenRL from here: {'; '.join(problems)}. "
                           "`repro launch --dry-run` still shows the config it would write")


def resume_point(recipe: Recipe, run_dir: Path) -> Checkpoint | None:
    return latest_lumenrl_checkpoint(checkpoint_root(recipe, Path(run_dir)))


def write_config(recipe: Recipe, run_dir: Path, resume: bool) -> Path:
    return prepare_config(recipe, Path(run_dir), resume)[0]


SEAM = EngineSeam(plan=plan_lumenrl_run, run=run_lumenrl, dry_run=dry_run, check_launch=check_launch,
                  latest_checkpoint=resume_point, write_config=write_config)
