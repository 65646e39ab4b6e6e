"""Open a run: check the run directory, resolve the model, load data, start the groups, resume if asked.

Run directory layout (documented in README):
    recipe.yaml            the resolved recipe (every default spelled out)
    data/                  generated datasets (tiny recipe)
    metrics.jsonl          one row per step and per evaluation (metrics.parquet at the end)
    eval/step_NNNNNN.json  per-problem correct counts and a sample response
    rollouts/step_NNNNNN.jsonl.gz  every trajectory of the step (tracking.rollouts)
    tensorboard/, wandb/   the same rows as metrics.jsonl for TensorBoard and W&B (tracking.tensorboard, .wandb)
    checkpoints/step_NNNNNN/  trainer state + loop state + the log up to that step (newest `keep_last`)
    logs/                  Ray and run logs
"""

from __future__ import annotations

import shutil
from pathlib import Path
from repro.run.checkpoints import latest_checkpoint, restore_driver_rng
from repro.recipes.schema import Recipe
from repro.data.sampler import PromptSampler
from repro.data.recipe_datasets import all_prompt_ids, load_dataset
from repro.errors import ReproError
from repro.run.metrics_log import MetricsLog
from repro.run.rollouts_file import NoRollouts, RolloutsDir
from repro.run.sinks import check_sinks, open_sinks
from repro.recipes import dump_recipe, require_paths
from repro.groups.protocol import RolloutGroup, TrainerGroup
from repro.run.state import Run


def checkpoint_bytes(recipe: Recipe) -> int:
    """Weights in the trainer dtype + fp32 master copy (bf16 only) + two fp32 Adam moments, per parameter."""
    per_param = {"bf16": 2 + 4 + 8, "fp32": 4 + 8}[recipe.actor.dtype]
    return recipe.model.num_parameters * per_param


def prepare_run_dir(recipe: Recipe, run_dir: Path, resume: bool) -> None:
    """Fail before step 1 if the run cannot finish: unwritable folder, too little disk, or a clash."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-probe"
        probe.write_bytes(b"\0" * (1 << 20))
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
    if not resume and (run_dir / "metrics.jsonl").exists():
        raise ReproError(
            f"run dir {run_dir} already holds a run (metrics.jsonl); pass --resume to continue it, "
            "or choose another --run-dir"
        )
    for sub in ("logs", "eval", "checkpoints"):
        (run_dir / sub).mkdir(exist_ok=True)
    check_sinks(recipe, run_dir)
    dump_recipe(recipe, run_dir / "recipe.yaml")


def resolve_model_dir(recipe: Recipe) -> Path:
    if recipe.model.path == "builtin:tiny-dsv4-warm":
        from repro.model.assets import ensure_warm_checkpoint

        return ensure_warm_checkpoint()
    return require_paths(recipe, ("model.path",))["model.path"]


def check_inputs(recipe: Recipe, run_dir: Path, resume: bool) -> Path:
    """Everything that can fail before a worker starts: the run directory, the data paths, the model folder.
    Returns the model folder."""
    prepare_run_dir(recipe, run_dir, resume)
    if recipe.data.train.path or recipe.data.eval.path:
        require_paths(recipe, ("data.train.path", "data.eval.path"))
    return resolve_model_dir(recipe)


def open_run(recipe: Recipe, run_dir: str | Path, trainer: TrainerGroup, rollout: RolloutGroup,
             resume: bool = False) -> Run:
    """The run over started groups: data loaded, and with ``resume`` the newest complete checkpoint restored
    (trainer state, sampler, driver RNG, the log as it stood) and its weights synced to the rollout; then the
    tracking sinks started on the log as it now stands (the caller closes them: ``run.metrics.close()``)."""
    from repro.model.hf_folder import load_tiny_tokenizer

    run_dir = Path(run_dir)
    model_dir = resolve_model_dir(recipe)
    tokenizer = load_tiny_tokenizer(model_dir)
    train = load_dataset(recipe.data.train, run_dir / "data", seed=recipe.seed)
    held_out = load_dataset(recipe.data.eval, run_dir / "data", seed=recipe.seed)
    run = Run(
        recipe=recipe, run_dir=run_dir, trainer=trainer, rollout=rollout, tokenizer=tokenizer,
        train_problems=train, train_prompt_ids=all_prompt_ids(tokenizer, train, recipe.data.train.template),
        eval_problems=held_out, eval_prompt_ids=all_prompt_ids(tokenizer, held_out, recipe.data.eval.template),
        sampler=PromptSampler(len(train), recipe.algorithm.prompts_per_step, recipe.seed),
        metrics=MetricsLog(run_dir / "metrics.jsonl"),
        rollouts=(RolloutsDir(run_dir, tokenizer, recipe.rollout_correction.threshold) if recipe.tracking.rollouts
                  else NoRollouts()),
    )
    if resume:
        restore_checkpoint(run)
    run.metrics.sinks = open_sinks(recipe, run_dir, run.metrics.rows())
    return run


def restore_checkpoint(run: Run) -> None:
    """The newest complete checkpoint into ``run`` (none yet: the log is removed, the run starts from step 0)."""
    from repro.run.steps import sync_weights

    checkpoint = latest_checkpoint(run.checkpoint_dir)
    if checkpoint is None:
        run.metrics.path.unlink(missing_ok=True)  # killed before the first checkpoint: start over cleanly
        return
    state = checkpoint.loop_state()
    run.trainer.load(checkpoint.trainer_dir)
    run.sampler.load_state(state["sampler"])
    restore_driver_rng(state["driver_rng"])
    saved_log = checkpoint.path / "metrics.jsonl"
    tmp = run.metrics.path.with_name("metrics.jsonl.tmp")
    shutil.copyfile(saved_log, tmp) if saved_log.exists() else tmp.write_text("")
    tmp.replace(run.metrics.path)  # the log as it stood at the checkpoint: no lost or repeated step
    sync_weights(run.trainer, run.rollout, state["weight_version"])
    run.start_step = checkpoint.step
