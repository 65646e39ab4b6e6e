"""A run whose engine is verl: plan it (resume from verl's checkpoints), write its data and overrides, compose and
check its config with verl's own code, start it, stream its metrics into metrics.jsonl, stop it. ``seam`` hands
these to ``repro.engines``, so ``repro run``, ``repro launch`` and notebooks 02/03 start it the one way.

Resume: the newest complete ``global_step_N`` (checkpoints.py) is the step the log is cut back to; verl is started
with ``trainer.resume_mode=resume_path`` and that folder, never ``auto``. A run that logged every step and exited 0
is recorded as finished (``verl/finished.json``), so running notebook 03 again does nothing.
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Literal

from repro.process_group import STOP_GRACE_S, EngineProcess, end_recorded_process, record_process, start_process
from repro.recipes import require_paths
from repro.recipes.schema import Recipe
from repro.run.checkpoints import Checkpoint
from repro.run.metrics_log import MetricsLog
from repro.run.plan import RunOutcome, RunPlan, terminate_as_exit
from repro.run.planning import plan_run
from repro.run.program_dir import open_program_run_dir, record_recipe, settle_log
from repro.run.sinks import wandb_run_id
from repro.run.state import Progress, no_progress
from repro.verl import compose, data, launch, overrides as ov
from repro.verl.checkpoints import incomplete, latest_verl_checkpoint, step_folders
from repro.verl.mapping import departures
from repro.verl.stream import VerlStream

LOG = Path("logs") / "verl.log"
WORK = Path("verl")  # overrides.txt, config.yaml, command.sh, metrics.attempt-N.jsonl, process.json, finished.json
ORIGINS_FILE = "origins.json"  # repro.verl.analysis reads it
POLL_S = 0.5
REWARD_FILE = Path(__file__).with_name("reward_fn.py")


def checkpoint_root(recipe: Recipe, run_dir: Path) -> Path:
    configured = recipe.verl.checkpoint_dir
    return Path(configured).expanduser() if configured else Path(run_dir) / "checkpoints"


def finished_step(run_dir: Path) -> int | None:
    path = Path(run_dir) / WORK / "finished.json"
    return json.loads(path.read_text())["step"] if path.is_file() else None


def finished_checkpoint(run_dir: Path) -> Checkpoint | None:
    """verl's run ended (finished.json, written once it exited at the last step), as the plan's checkpoint."""
    done = finished_step(run_dir)
    return None if done is None else Checkpoint(done, Path(run_dir) / WORK / "finished.json")


def plan_verl_run(recipe: Recipe, run_dir: str | Path, resume: bool | Literal["auto"] = False,
                  fresh: bool | str = False) -> RunPlan:
    """``repro.run.planning.plan_run`` on verl's checkpoints (the half-written ones named as passed over) and its
    record of a finished run. Reads only."""
    root = checkpoint_root(recipe, Path(run_dir))
    return plan_run(run_dir, recipe.steps, lambda: (latest_verl_checkpoint(root), incomplete(root)), resume, fresh,
                    finished=lambda: finished_checkpoint(Path(run_dir)))


def run_files(recipe: Recipe, run_dir: Path, resume_from: Path | None, attempt: int) -> ov.RunFiles:
    run_dir = Path(run_dir).resolve()
    data_dir = Path(recipe.verl.data_dir).expanduser() if recipe.verl.data_dir else run_dir / WORK / "data"
    reward = Path(recipe.verl.reward_function).expanduser() if recipe.verl.reward_function else REWARD_FILE
    return ov.RunFiles(data_dir / "train.parquet", data_dir / "val.parquet", checkpoint_root(recipe, run_dir).resolve(),
                       run_dir / WORK / f"metrics.attempt-{attempt}.jsonl", reward.resolve(), resume_from, run_dir)


def environment(recipe: Recipe, files: ov.RunFiles) -> dict[str, str]:
    env = ov.worker_env(recipe, files)
    if recipe.tracking.wandb.enabled:  # one W&B run across attempts, as our own loop and LumenRL's logger do
        env.update({"WANDB_RUN_ID": wandb_run_id(files.run_dir), "WANDB_RESUME": "allow"})
    return env


def overrides_for(recipe: Recipe, files: ov.RunFiles, resuming: bool) -> tuple[list[str], dict[str, str]]:
    env = environment(recipe, files)
    return ov.verl_overrides(recipe, files, env), env


def prepare_config(recipe: Recipe, run_dir: Path, files: ov.RunFiles, resuming: bool) -> tuple[Path, list[str], dict]:
    """Data files, the overrides composed and checked by verl's code (verl/config.yaml), command.sh; returns the
    config path, the command and the driver's environment. Raises naming each problem before anything starts."""
    work = Path(run_dir) / WORK
    written, env = overrides_for(recipe, files, resuming)
    config = compose.check_config(written)
    header = [f"verl config composed by verl's own Hydra config (ppo_trainer) from recipe {recipe.name!r} and the "
              "overrides in overrides.txt; validated by verl's validate_config and repro's run-time checks."]
    header += [f"Departure: {note}" for note in departures(recipe)]
    path = compose.write_composed(config, work / "config.yaml", "\n".join(header))
    _write(work / "overrides.txt", "\n".join(written) + "\n")
    command, driver = launch.verl_command(recipe, written), launch.driver_env(recipe, env)
    _write(work / "command.sh", launch.command_script(command, driver, Path(run_dir).resolve()))
    return path, command, driver


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def prepare_run_dir(recipe: Recipe, plan: RunPlan, say: Callable[[str], None],
                    grace_s: float) -> tuple[MetricsLog, int]:
    """What can fail before verl starts, then the run directory made ready (as LumenRL's run does): returns the log,
    cut back to the resume step, and that step."""
    problems = launch.install_problems(recipe)
    if problems:
        raise launch.VerlError("verl cannot be started from here: " + "; ".join(problems))
    if plan.resume and plan.checkpoint is None and plan.ignored:
        raise launch.VerlError(f"{checkpoint_root(recipe, plan.run_dir)}: no complete checkpoint to resume from "
                               f"({'; '.join(plan.ignored)}); verl would start from scratch. Move them aside to "
                               "start again, or finish writing one")
    run_dir = plan.run_dir
    metrics, changes = open_program_run_dir(recipe, plan, say, run_dir / WORK, run_dir / LOG)
    require_paths(recipe, ("model.path",) + tuple(f"data.{s}.path" for s in ("train", "eval")
                                                   if getattr(recipe.data, s).path))
    record_recipe(recipe, plan)
    ended = end_recorded_process(run_dir / WORK / "process.json", grace_s)
    if ended:
        say(f"stopped verl {ended}, which an earlier launch of {run_dir} left running")
    root = checkpoint_root(recipe, run_dir)
    if not plan.resume and step_folders(root):
        raise launch.VerlError(f"verl.checkpoint_dir: {root} already holds {step_folders(root)[-1][1].name} "
                               "(another run's); resume that run, or choose another verl.checkpoint_dir")
    start_step = settle_log(recipe, plan, metrics, changes, say, run_dir / WORK / "finished.json",
                            run_dir / WORK / ORIGINS_FILE)
    return metrics, start_step


def attempt_number(run_dir: Path) -> int:
    return 1 + len(list((Path(run_dir) / WORK).glob("metrics.attempt-*.jsonl")))


def run_verl(recipe: Recipe, plan: RunPlan, *, in_process: bool = False, progress: Progress = no_progress,
             say: Callable[[str], None] = print, grace_s: float = STOP_GRACE_S) -> RunOutcome:
    """Start verl, stream its metrics until it exits, stop it whatever happens here. Raises VerlError when it
    fails or stops before the recipe's last step."""
    if in_process:
        say("engine verl: in_process does not apply (verl runs as its own program on the Ray head)")
    started = time.perf_counter()
    run_dir = plan.run_dir
    say(plan.describe())
    if plan.finished:
        return RunOutcome(run_dir, plan.checkpoint.step, plan.checkpoint.step, 0.0, time.perf_counter() - started,
                          already_finished=True)
    metrics, start_step = prepare_run_dir(recipe, plan, say, grace_s)
    for note in departures(recipe):
        say(f"departure: {note}")
    files = run_files(recipe, run_dir, plan.checkpoint.path if start_step else None, attempt_number(run_dir))
    train_rows, val_rows = data.write_datasets(recipe, files.train_file.parent)[2:]
    say(f"data in verl's layout: {files.train_file} ({train_rows} rows), {files.val_file} ({val_rows} rows)")
    config, command, env = prepare_config(recipe, run_dir, files, resuming=start_step > 0)
    log = run_dir / LOG
    with open(log, "a") as handle:
        handle.write(f"=== repro: starting verl at {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC, "
                     f"{'resuming after step ' + str(start_step) if start_step else 'from step 0'} ===\n")
    stream = VerlStream(files.metrics_file, log, metrics, progress, log.stat().st_size,
                        origins_path=run_dir / WORK / ORIGINS_FILE)
    with ExitStack() as stack:
        stack.enter_context(terminate_as_exit())
        stack.push(lambda kind, err, tb: metrics.close(exit_code=0 if kind is None else 1))
        process = start_process(command, env, run_dir.resolve(), log)
        stack.callback(_stop, process, grace_s, say, run_dir / WORK / "process.json")
        record_process(run_dir / WORK / "process.json", process)
        say(f"verl started (pid {process.pid}, its own process group); config {config}, log {log}")
        while process.poll() is None:
            stream.poll()
            time.sleep(POLL_S)
        stream.finish()
        code = process.poll()
    with open(log, "a") as handle:
        handle.write(f"=== exit={code} ===\n")
    hint = resume_hint(recipe, run_dir)
    if code != 0:
        raise launch.VerlError(f"verl exited with status {code} after logging step {stream.last_step}; its log {log} "
                               f"ends:\n{_tail(log)}\n{hint}")
    logged = max((r["step"] for r in metrics.rows() if r.get("kind") == "train"), default=0)
    if logged < recipe.steps:
        raise launch.VerlError(f"verl exited 0 but logged {logged} of {recipe.steps} steps; log {log}; {hint}")
    _write(run_dir / WORK / "finished.json", json.dumps({"step": logged, "at": f"{datetime.now(timezone.utc):%FT%TZ}"}))
    metrics.write_parquet()
    return RunOutcome(run_dir, start_step, recipe.steps, 0.0, time.perf_counter() - started)


def resume_hint(recipe: Recipe, run_dir: Path) -> str:
    newest = latest_verl_checkpoint(checkpoint_root(recipe, run_dir))
    if newest is None:
        return "no complete verl checkpoint was written yet: rerun from the start"
    return f"the last complete verl checkpoint is step {newest.step} ({newest.path}): rerun with --resume"


def _tail(path: Path, lines: int = 8) -> str:
    text = path.read_text(errors="replace").splitlines()[-lines:] if path.is_file() else []
    return "\n".join(f"    {line[:200]}" for line in text)


def _stop(process: EngineProcess, grace_s: float, say: Callable[[str], None], record: Path) -> None:
    if process.poll() is None or process.group_alive():
        sent = process.stop(grace_s)
        if sent:
            say(f"stopped verl (pid {process.pid}) with {', '.join(sent)}")
    if not process.group_alive():
        record.unlink(missing_ok=True)
