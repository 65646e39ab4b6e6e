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
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import yaml

from repro.recipes.earlier import EARLIER_CONVENTIONS, fill_earlier_conventions
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
from repro.run.state import Run
from repro.run.steps import sync_weights


LOCK_FILE = "run.lock"


@contextmanager
def run_dir_lock(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir`` for this process while the block runs: a second run on the same folder (another shell,
    a notebook, a second node on a shared disk) fails at once, naming the holder, instead of writing every row
    twice. The kernel drops the lock when the holder exits, however it ends (kill -9 included)."""
    import fcntl

    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        handle = open(run_dir / LOCK_FILE, "a+")
    except OSError as err:
        raise ReproError(f"run dir {run_dir}: cannot write there ({err.strerror or err})") from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "a process that has not written its name yet"
            raise ReproError(f"run dir {run_dir} is in use by another run ({holder}; lock {run_dir / LOCK_FILE}): "
                             "wait for it to end or stop it, or choose another --run-dir") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(sys.argv)[:300]}\n")
        handle.flush()
        yield


def clear_run_dir(run_dir: Path) -> None:
    """Delete everything in ``run_dir`` but its lock (a fresh run over an old one, the lock held)."""
    for path in run_dir.iterdir():
        if path.name == LOCK_FILE:
            continue
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


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
    if resume:
        check_conventions_kept(recipe, run_dir / "recipe.yaml")
    if not resume and (run_dir / "metrics.jsonl").exists():
        raise ReproError(
            f"run dir {run_dir} already holds a run (metrics.jsonl); pass --resume to continue it, "
            "or choose another --run-dir"
        )
    for sub in ("logs", "eval", "checkpoints"):
        (run_dir / sub).mkdir(exist_ok=True)
    check_sinks(recipe, run_dir)
    dump_recipe(recipe, run_dir / "recipe.yaml")


def check_conventions_kept(recipe: Recipe, stored_path: Path) -> None:
    """A run written before a convention became a recipe field ran the earlier convention; resuming it under
    today's default would change the algorithm halfway. Refuse, naming the ``--set`` that keeps the run as it was."""
    if not stored_path.is_file():
        return
    stored = yaml.safe_load(stored_path.read_text())
    if not isinstance(stored, dict):
        return
    current = recipe.model_dump()
    changed = []
    for dotted in fill_earlier_conventions(stored):
        value = current
        for part in dotted.split("."):
            value = value[part]
        if value != EARLIER_CONVENTIONS[dotted]:
            changed.append(f"--set {dotted}={'null' if EARLIER_CONVENTIONS[dotted] is None else EARLIER_CONVENTIONS[dotted]}")
    if changed:
        raise ReproError(
            f"run dir {stored_path.parent} was started before these conventions were recipe fields and ran the "
            f"earlier ones; resume it as it ran with {' '.join(changed)} (or start a new run dir for AMD's)"
        )


def resolve_model_dir(recipe: Recipe) -> Path:
    if recipe.model.path == "builtin:tiny-dsv4-warm":
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
            run.metrics.sinks = open_sinks(recipe, run_dir, run.metrics.rows())
            return run
        state = checkpoint.loop_state()
        trainer.load(checkpoint.trainer_dir)
        run.sampler.load_state(state["sampler"])
        restore_driver_rng(state["driver_rng"])
        restore_log(run.metrics, checkpoint.path / "metrics.jsonl")
        sync_weights(trainer, rollout, state["weight_version"])
        run.start_step = checkpoint.step
    run.metrics.sinks = open_sinks(recipe, run_dir, run.metrics.rows())
    return run


def restore_log(metrics: MetricsLog, saved: Path | None) -> None:
    """The log as it stood at the checkpoint (``saved``: its copy; None: no checkpoint, an empty log), so no step
    is lost or logged twice; ``restart`` rows written since are kept after it: they are the run's history, not a
    step's result."""
    import json

    kept = MetricsLog(saved).rows() if saved is not None and saved.exists() else []
    history = [r for r in metrics.rows() if r.get("kind") == "restart" and r not in kept]
    if not history and not kept:
        metrics.path.unlink(missing_ok=True)
        return
    tmp = metrics.path.with_name(metrics.path.name + ".tmp")
    if history:
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept + history))
    else:
        shutil.copyfile(saved, tmp)
    tmp.replace(metrics.path)
