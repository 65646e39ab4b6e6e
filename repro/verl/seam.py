"""verl as an engine (``engine: verl``): its seam (``repro.engine_seam``). Config writer ``run.prepare_config``
(overrides composed and checked by verl's code), dry run ``describe.describe_launch`` with the trainer's memory
budget, launch check ``launch.install_problems``, resume point ``checkpoints.latest_verl_checkpoint``. What the
analysis reads of its runs is ``analysis`` (named in the engine table, so the analysis never imports this)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from repro.engine_seam import EngineSeam
from repro.recipes.schema import Recipe
from repro.run.checkpoints import Checkpoint
from repro.verl import launch
from repro.verl.checkpoints import latest_verl_checkpoint
from repro.verl.run import checkpoint_root, plan_verl_run, prepare_config, run_files, run_verl


def dry_run(recipe: Recipe, run_dir: Path, *, simulate: bool, timeout_s: float, say: Callable[[str], None]) -> None:
    from repro.run.launch import format_memory_budget
    from repro.verl.describe import describe_launch

    say(describe_launch(recipe, run_dir))
    say(format_memory_budget(recipe))


def check_launch(recipe: Recipe) -> None:
    problems = launch.install_problems(recipe)
    if problems:
        raise launch.VerlError(f"recipe {recipe.name} cannot start verl from here: {'; '.join(problems)}. "
                               "`repro launch --dry-run` still shows the overrides it would write")


def resume_point(recipe: Recipe, run_dir: Path) -> Checkpoint | None:
    return latest_verl_checkpoint(checkpoint_root(recipe, Path(run_dir)))


def write_config(recipe: Recipe, run_dir: Path, resume: bool) -> Path:
    checkpoint = resume_point(recipe, run_dir) if resume else None
    files = run_files(recipe, run_dir, checkpoint.path if checkpoint else None, 1)
    return prepare_config(recipe, Path(run_dir), files, resuming=checkpoint is not None)[0]


SEAM = EngineSeam(plan=plan_verl_run, run=run_verl, dry_run=dry_run, check_launch=check_launch,
                  latest_checkpoint=resume_point, write_config=write_config)
