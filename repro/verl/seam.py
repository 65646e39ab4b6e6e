"""verl as an engine (``engine: verl``): its seam (``repro.engine_seam``). Config writer ``run.prepare_config``
(overrides composed and checked by verl's code), dry run ``describe.describe_launch`` with the trainer's memory
budget, launch check ``launch.install_problems``, resume point ``checkpoints.latest_verl_checkpoint``, what the
analysis reads of a streamed run (key origins; verl's step time excludes validation), and verl's caveats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from repro.engine_seam import EngineSeam
from repro.recipes.schema import Recipe
from repro.run.checkpoints import Checkpoint
from repro.verl import launch
from repro.verl.checkpoints import latest_verl_checkpoint
from repro.verl.run import ORIGINS_FILE, WORK, checkpoint_root, plan_verl_run, prepare_config, run_files, run_verl

if TYPE_CHECKING:
    from repro.analysis.frame import RunFrames


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


def about_run_dir(run_dir: Path) -> dict:
    """Key origins of a run streamed from verl; its timing_s/step stops before validation (trainer_base.py: the
    'testing' timer runs after the 'step' timer closes)."""
    path = Path(run_dir) / WORK / ORIGINS_FILE
    origins = json.loads(path.read_text()) if path.is_file() else {}
    return {"origins": origins, "step_time_includes_eval": False,
            "notes": ["Streamed from verl's file logger (engine: verl), keys renamed as for a verl JSONL"]}


def caveats(frames: "RunFrames") -> list[str]:
    notes = ["verl (engine: verl) never evaluates after the first update: AMD's 'start' AIME figure (step 1) has "
             "no counterpart in this run; its first evaluation is before training (eval.at_start) or at "
             "eval.every_steps.",
             "verl's timing_s/step excludes its evaluation (timed apart as timing_s/testing), unlike LumenRL's "
             "DeepSeek-V4 trainer, which times validation inside the step."]
    if not any(c.startswith("rollout_corr/pos_") for c in frames.train.columns):
        notes.append("verl 0.9.1 logs no KL by response position (rollout_corr/pos_*); the position figures are "
                     "empty for this run.")
    return notes


SEAM = EngineSeam(plan=plan_verl_run, run=run_verl, dry_run=dry_run, check_launch=check_launch,
                  latest_checkpoint=resume_point, write_config=write_config, about_run_dir=about_run_dir,
                  caveats=caveats)
