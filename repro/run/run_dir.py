"""Open a run: check the run directory, resolve the model, load data, start the groups, resume if asked.

Run directory layout (documented in README):
    recipe.yaml            the resolved recipe (every default spelled out)
    data/                  generated datasets (tiny recipe)
    metrics.jsonl          one row per step and per evaluation (metrics.parquet at the end)
    eval/step_NNNNNN.json  per-problem correct counts and a sample response
    rollouts/step_NNNNNN.jsonl.gz  every trajectory of the step (tracking.rollouts)
    tensorboard/, wandb/   the same rows as metrics.jsonl for TensorBoard and W&B (tracking.tensorboard, .wandb)
    checkpoints/step_NNNNNN/  trainer state + loop state + the log up to that step (newest `keep_last`)
    logs/                  Ray and run logs; workers.json: each worker's process id, host and log file, per start
    run.lock               held (flock) by the run using the folder; it names that run's process
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from repro.owned import open_no_follow, write_atomic
from repro.recipes.resume import RECIPE_FILE, RESUME, check_conventions_kept, read_run_recipe, resume_changes
from repro.run.checkpoints import latest_checkpoint, restore_driver_rng
from repro.recipes.schema import Recipe
from repro.readiness.memory_budget import checkpoint_bytes
from repro.data.sampler import PromptSampler
from repro.data.recipe_datasets import load_dataset, recipe_prompt_ids
from repro.errors import ReproError
from repro.model.hf_folder import load_tiny_tokenizer
from repro.model.warmstart_io import ensure_warm_checkpoint
from repro.run.metrics_log import MetricsLog
from repro.run.rollouts_file import NoRollouts, RolloutsDir
from repro.run.sinks import check_sinks, open_sinks
from repro.recipes import dump_recipe, require_paths
from repro.groups.protocol import RolloutGroup, TrainerGroup
from repro.run.folder import LOCK_FILE, check_run_folder, record_resume, run_dir_lock  # noqa: F401  (re-exported)
from repro.run.restarts import RESTART
from repro.run.state import Run
from repro.run.steps import sync_weights


def prepare_run_dir(recipe: Recipe, run_dir: Path, resume: bool, fresh: bool = False) -> dict[str, list]:
    """Fail before step 1 if the run cannot finish or would change what is not its own: a link out of the folder,
    a new run in someone's folder, an unwritable folder, too little disk, a clash, or a resume under another
    recipe (repro.recipes.resume). Returns the fields a resume changed ({field: [old, new]}; recorded in
    recipe.yaml and as a ``resume`` row of the log once the run has resumed, by record_resume_changes), else
    {}. ``fresh``: the folder was a run's, just emptied
    of the run's files (others' are kept beside the new run)."""
    check_run_folder(run_dir, resume or fresh)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-probe"
        if probe.is_symlink() or probe.exists():
            probe.unlink()  # a killed run's probe (a link is removed itself, never written through)
        fd = open_no_follow(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            os.write(fd, b"\0" * (1 << 20))
        finally:
            os.close(fd)
            probe.unlink()
    except OSError as err:
        raise ReproError(f"run dir {run_dir}: cannot write there ({err.strerror or err})") from None
    need = checkpoint_bytes(recipe) * (recipe.checkpoint.keep_last + 1)
    free = shutil.disk_usage(run_dir).free
    if free < need:
        raise ReproError(
            f"run dir {run_dir}: {free / 1e9:.2f} GB free, checkpoints need about {need / 1e9:.2f} GB "
            f"({recipe.checkpoint.keep_last} kept + 1 being written, {checkpoint_bytes(recipe) / 1e9:.2f} GB each)"
        )
    stored = run_dir / RECIPE_FILE
    changes = resume_recipe_changes(recipe, run_dir) if resume else {}
    if not resume and (run_dir / "metrics.jsonl").exists():
        raise ReproError(
            f"run dir {run_dir} already holds a run (metrics.jsonl); pass --resume to continue it, "
            "or choose another --run-dir"
        )
    for sub in ("logs", "eval", "checkpoints"):
        (run_dir / sub).mkdir(exist_ok=True)
    check_sinks(recipe, run_dir)
    if not resume or not stored.is_file():  # written once; a resume's changes once it has resumed (open_run)
        dump_recipe(recipe, stored)
    return changes


def record_resume_changes(recipe: Recipe, run_dir: Path, metrics: MetricsLog, step: int) -> None:
    """After a resume has restored the run (so a resume its trainer refuses leaves the record as it was): the
    fields it changed go into recipe.yaml and a ``resume`` row of the log."""
    record_resume(recipe, run_dir, metrics, step, resume_recipe_changes(recipe, run_dir), print)


def resume_recipe_changes(recipe: Recipe, run_dir: Path) -> dict[str, list]:
    """What a resume of ``run_dir`` with ``recipe`` changes of the recipe the run started with (RESUMABLE fields
    only; repro.recipes.resume refuses any other difference), checked against the run's recipe.yaml and against
    the copy the newest checkpoint that verifies holds (so a recipe.yaml edited since is refused too). Reads only."""
    stored = run_dir / RECIPE_FILE
    if stored.is_file():
        read_run_recipe(stored)  # an unreadable record is refused naming its line
    check_conventions_kept(recipe, stored)
    changes = resume_changes(stored, recipe)
    newest = latest_checkpoint(run_dir / "checkpoints")
    if newest is not None and (newest.path / RECIPE_FILE).is_file():
        resume_changes(newest.path / RECIPE_FILE, recipe, hint=(
            f"{stored} was changed since step {newest.step} was trained with it: put those values back there, or "
            "start a new --run-dir"))
    return changes


def resolve_model_dir(recipe: Recipe) -> Path:
    if recipe.model.path == "builtin:tiny-dsv4-warm":
        return ensure_warm_checkpoint()
    return require_paths(recipe, ("model.path",))["model.path"]


def check_inputs(recipe: Recipe, run_dir: Path, resume: bool, fresh: bool = False) -> Path:
    """Everything that can fail before a worker starts: the run directory, the data paths, the model folder.
    Returns the model folder."""
    prepare_run_dir(recipe, run_dir, resume, fresh)
    if recipe.data.train.path or recipe.data.eval.path:
        require_paths(recipe, ("data.train.path", "data.eval.path"))
    return resolve_model_dir(recipe)


def open_run(recipe: Recipe, run_dir: str | Path, trainer: TrainerGroup, rollout: RolloutGroup,
             resume: bool = False) -> Run:
    """The run over started groups: data loaded, and with ``resume`` the newest complete checkpoint restored
    (trainer state, sampler, driver RNG, the log as it stood) and its weights synced to the rollout; then the
    tracking sinks started on the log as it now stands (the caller closes them: ``run.metrics.close()``)."""
    run_dir = Path(run_dir)
    model_dir = resolve_model_dir(recipe)
    tokenizer = load_tiny_tokenizer(model_dir)
    train = load_dataset(recipe.data.train, run_dir / "data", seed=recipe.seed)
    held_out = load_dataset(recipe.data.eval, run_dir / "data", seed=recipe.seed)
    run = Run(
        recipe=recipe, run_dir=run_dir, trainer=trainer, rollout=rollout, tokenizer=tokenizer,
        train_problems=train, train_prompt_ids=recipe_prompt_ids(tokenizer, train, recipe, "train"),
        eval_problems=held_out, eval_prompt_ids=recipe_prompt_ids(tokenizer, held_out, recipe, "eval"),
        sampler=PromptSampler.for_recipe(recipe, len(train)),
        metrics=MetricsLog(run_dir / "metrics.jsonl"),
        rollouts=(RolloutsDir(run_dir, tokenizer, recipe.rollout_correction.threshold) if recipe.tracking.rollouts
                  else NoRollouts()),
    )
    if resume:
        checkpoint = latest_checkpoint(run.checkpoint_dir)
        if checkpoint is None:  # stopped before the first checkpoint: start over cleanly
            restore_log(run.metrics, None)
            record_resume_changes(recipe, run_dir, run.metrics, 0)
            run.metrics.sinks = open_sinks(recipe, run_dir, run.metrics.rows())
            return run
        state = checkpoint.loop_state()
        trainer.load(checkpoint.trainer_dir)
        run.sampler.load_state(state["sampler"])
        restore_driver_rng(state["driver_rng"])
        restore_log(run.metrics, checkpoint.path / "metrics.jsonl")
        sync_weights(trainer, rollout, state["weight_version"])
        run.start_step = checkpoint.step
        record_resume_changes(recipe, run_dir, run.metrics, checkpoint.step)
    run.metrics.sinks = open_sinks(recipe, run_dir, run.metrics.rows())
    return run


def restore_log(metrics: MetricsLog, saved: Path | None) -> None:
    """The log as it stood at the checkpoint (``saved``: its copy; None: no checkpoint, an empty log), so no step
    is lost or logged twice; ``restart`` rows written since are kept after it: they are the run's history, not a
    step's result; ``resume`` rows (a resume changed a RESUMABLE recipe field) likewise."""
    import json

    kept = MetricsLog(saved).rows() if saved is not None and saved.exists() else []
    history = [r for r in metrics.rows() if r.get("kind") in (RESTART, RESUME) and r not in kept]
    if not history and not kept:
        metrics.path.unlink(missing_ok=True)
        return
    write_atomic(metrics.path, "".join(json.dumps(r) + "\n" for r in kept + history) if history
                 else saved.read_bytes())
