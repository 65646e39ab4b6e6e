"""A run whose engine is LumenRL: plan it (resume from LumenRL's checkpoints), write its config, start it, stream
its log into metrics.jsonl, stop it. ``repro.engines`` calls these for ``engine: lumenrl``, so ``repro run``,
``repro launch`` and notebooks 02/03 start it the one way.

Resume: the newest LumenRL checkpoint (``global_step_N/``, see checkpoints.py) is the step the log is cut back to;
LumenRL is started with ``checkpointing.resume: true`` and its next line is ``step=N+1``. A run that logged every
step and exited 0 is recorded as finished (``lumenrl/finished.json``), so running notebook 03 again does nothing,
as it does for our own runs.
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Literal

from repro.analysis.lumenrl_origins import ORIGINS_FILE
from repro.lumenrl import config as lumenrl_config, launch
from repro.lumenrl.checkpoints import latest_lumenrl_checkpoint, lumenrl_checkpoints
from repro.lumenrl.stream import MetricsStream
from repro.lumenrl.tracking import wandb_env
from repro.recipes import require_paths
from repro.recipes.schema import Recipe
from repro.run.checkpoints import Checkpoint
from repro.run.metrics_log import MetricsLog
from repro.run.plan import RunOutcome, RunPlan, terminate_as_exit
from repro.run.planning import plan_run
from repro.run.program_dir import open_program_run_dir, record_recipe, settle_log
from repro.run.sinks import check_sinks, open_sinks
from repro.run.state import Progress, no_progress

LOG = Path("logs") / "lumenrl.log"
WORK = Path("lumenrl")  # config.yaml, command.sh, process.json, finished.json, origins.json
POLL_S = 0.5
ABSENT = object()


def checkpoint_root(recipe: Recipe, run_dir: Path) -> Path:
    configured = recipe.lumenrl.checkpoint_dir
    return Path(configured).expanduser() if configured else run_dir / "checkpoints"


def finished_step(run_dir: Path) -> int | None:
    path = run_dir / WORK / "finished.json"
    return json.loads(path.read_text())["step"] if path.is_file() else None


def finished_checkpoint(run_dir: Path) -> Checkpoint | None:
    """LumenRL's run ended (finished.json, written once it exited at the last step), as the plan's checkpoint."""
    done = finished_step(run_dir)
    return None if done is None else Checkpoint(done, run_dir / WORK / "finished.json")


def plan_lumenrl_run(recipe: Recipe, run_dir: str | Path, resume: bool | Literal["auto"] = False,
                     fresh: bool | str = False) -> RunPlan:
    """``repro.run.planning.plan_run`` on LumenRL's checkpoints and its record of a finished run. Reads only."""
    root = checkpoint_root(recipe, Path(run_dir))
    return plan_run(run_dir, recipe.steps, lambda: (latest_lumenrl_checkpoint(root), []), resume, fresh,
                    finished=lambda: finished_checkpoint(Path(run_dir)))


def prepare_config(recipe: Recipe, run_dir: Path, resume: bool) -> tuple[Path, list[str], dict[str, str]]:
    """Write lumenrl/config.yaml and lumenrl/command.sh; returns (config path, command, environment)."""
    base_path = launch.base_config_path(recipe)
    base = lumenrl_config.read_base_config(base_path)
    written = lumenrl_config.lumenrl_config(recipe, base, checkpoint_root(recipe, run_dir).resolve(), resume)
    changed = lumenrl_config.changed_keys(base, written)
    header = [f"LumenRL config written by repro from recipe {recipe.name!r} on top of {base_path}.",
              "Keys the recipe (or this run) decides are replaced; all others are the base file's. Changed:"]
    header += [f"  {key}: {old!r} -> {new!r}" for key, old, new in changed]
    header += [f"Note: {note}" for note in lumenrl_config.config_notes(recipe)]
    path = lumenrl_config.write_config(written, run_dir / WORK / "config.yaml", "\n".join(header))
    command, env = launch.lumenrl_command(recipe, path), {**launch.lumenrl_env(recipe), **wandb_env(recipe, run_dir)}
    script = run_dir / WORK / ".command.sh.tmp"
    script.write_text(launch.command_script(command, env, launch.checkout_dir(recipe)))
    script.replace(run_dir / WORK / "command.sh")
    return path, command, env


def _check_fresh_checkpoints(recipe: Recipe, run_dir: Path) -> None:
    """A new run must not share LumenRL's checkpoint folder with another run: LumenRL would prune its folders."""
    root = checkpoint_root(recipe, run_dir)
    stale = lumenrl_checkpoints(root)
    if stale:
        raise launch.LumenRLError(
            f"lumenrl.checkpoint_dir: {root} already holds {stale[-1].path.name} (another run's); resume that run, "
            "or choose another lumenrl.checkpoint_dir")


def _tail(path: Path, lines: int = 8) -> str:
    text = path.read_text(errors="replace").splitlines()[-lines:] if path.is_file() else []
    return "\n".join(f"    {line[:200]}" for line in text)


def resume_hint(recipe: Recipe, run_dir: Path) -> str:
    newest = latest_lumenrl_checkpoint(checkpoint_root(recipe, run_dir))
    if newest is None:
        return "no LumenRL checkpoint was written yet: rerun from the start"
    return (f"the last LumenRL checkpoint is step {newest.step} ({newest.path}): rerun with --resume "
            "(notebook 03 resumes)")


def prepare_run_dir(recipe: Recipe, plan: RunPlan, say: Callable[[str], None],
                    grace_s: float) -> tuple[MetricsLog, int]:
    """Everything that can fail before LumenRL starts, then the run directory made ready: the checkout, the run
    directory (writable; a new run does not overwrite one), the model and data on this node, a LumenRL an earlier
    launch left running, the log cut back to the resume step. Returns the log and that step.

    The checkpoints' disk space is not checked here (repro's own runs check it in the run directory): LumenRL's
    shards go to checkpoint_dir on the trainer nodes, which `repro check` (notebook 00) looks at."""
    problems = launch.checkout_problems(recipe)
    if problems:
        raise launch.LumenRLError("LumenRL cannot be started from here: " + "; ".join(problems))
    run_dir = plan.run_dir
    metrics, changes = open_program_run_dir(recipe, plan, say, run_dir / WORK, run_dir / LOG)
    require_paths(recipe, ("model.path", "data.train.path", "data.eval.path"))  # the driver loads them here
    check_sinks(recipe, run_dir)
    record_recipe(recipe, plan)
    ended = launch.end_recorded_process(run_dir / WORK / "process.json", grace_s)
    if ended:
        say(f"stopped LumenRL {ended}, which an earlier launch of {run_dir} left running")
    if not plan.resume:
        _check_fresh_checkpoints(recipe, run_dir)
    start_step = settle_log(recipe, plan, metrics, changes, say, run_dir / WORK / "finished.json",
                            run_dir / WORK / ORIGINS_FILE)
    metrics.sinks = open_sinks(recipe, run_dir, metrics.rows())  # TensorBoard; W&B is LumenRL's own (tracking.py)
    return metrics, start_step


def run_lumenrl(recipe: Recipe, plan: RunPlan, *, in_process: bool = False, progress: Progress = no_progress,
                say: Callable[[str], None] = print, grace_s: float = launch.STOP_GRACE_S) -> RunOutcome:
    """``repro.run.start.run_repro`` for LumenRL: start it, stream its log until it exits, stop it whatever
    happens here. Raises LumenRLError when it fails or stops before the recipe's last step."""
    if in_process:
        say("engine lumenrl: in_process does not apply (LumenRL runs as its own process on the Ray head)")
    if recipe.checkpoint.max_restarts:
        say("engine lumenrl: checkpoint.max_restarts does not apply (LumenRL stops when a worker dies; "
            "rerun with --resume)")
    started = time.perf_counter()
    run_dir, work = plan.run_dir, plan.run_dir / WORK
    say(plan.describe())
    if plan.finished:
        return RunOutcome(run_dir, plan.checkpoint.step, plan.checkpoint.step, 0.0, time.perf_counter() - started,
                          already_finished=True)
    metrics, start_step = prepare_run_dir(recipe, plan, say, grace_s)
    config, command, env = prepare_config(recipe, run_dir, resume=start_step > 0)
    for note in lumenrl_config.config_notes(recipe):
        say(f"note: {note}")
    if recipe.lumenrl.ray_stop_first:
        say("ray stop --force (lumenrl.ray_stop_first)")
        launch.ray_stop()
    log = run_dir / LOG
    with open(log, "a") as handle:
        handle.write(f"=== repro: starting LumenRL at {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC, "
                     f"{'resuming after step ' + str(start_step) if start_step else 'from step 0'} ===\n")
    stream = MetricsStream(log, metrics, progress, log.stat().st_size, origins_path=work / ORIGINS_FILE)
    first_row_s = None
    with ExitStack() as stack:
        stack.enter_context(terminate_as_exit())
        stack.push(lambda kind, err, tb: metrics.close(exit_code=0 if kind is None else 1))
        process = launch.start_lumenrl(command, env, launch.checkout_dir(recipe), log)
        stack.callback(_stop, process, grace_s, say, work / "process.json")
        launch.record_process(work / "process.json", process)
        say(f"LumenRL started (pid {process.pid}, its own process group); config {config}, log {log}")
        while process.poll() is None:
            if stream.poll() and first_row_s is None:
                first_row_s = time.perf_counter() - started
            time.sleep(POLL_S)
        stream.finish()
        code = process.poll()
    with open(log, "a") as handle:
        handle.write(f"=== exit={code} ===\n")
    if code != 0:
        raise launch.LumenRLError(f"LumenRL exited with status {code} after logging step {stream.last_step}; its log "
                                  f"{log} ends:\n{_tail(log)}\n{resume_hint(recipe, run_dir)}")
    logged = max((r["step"] for r in metrics.rows() if r.get("kind") == "train"), default=0)
    if logged < recipe.steps:
        raise launch.LumenRLError(f"LumenRL exited 0 but logged {logged} of {recipe.steps} steps (interrupted?); "
                                  f"log {log}; {resume_hint(recipe, run_dir)}")
    (work / "finished.json").write_text(json.dumps({"step": logged,
                                                     "at": f"{datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ}"}))
    metrics.write_parquet()
    warmup_s = first_row_s if first_row_s is not None else 0.0
    say(f"LumenRL logged steps {start_step + 1}-{logged}; its first step was in the log {warmup_s:.1f} s after "
        "the start (start-up and that step)")
    return RunOutcome(run_dir, start_step, recipe.steps, warmup_s, time.perf_counter() - started)


def _stop(process: launch.LumenRLProcess, grace_s: float, say: Callable[[str], None], record: Path) -> None:
    """On the way out, whatever the reason: LumenRL's group must not outlive us. The record of it goes once it is
    gone (a record left behind is what the next launch checks, after a kill that ran no clean-up)."""
    if process.poll() is None or process.group_alive():
        sent = process.stop(grace_s)
        if sent:
            say(f"stopped LumenRL (pid {process.pid}) with {', '.join(sent)}")
    if not process.group_alive():
        record.unlink(missing_ok=True)


def describe_launch(recipe: Recipe, run_dir: Path) -> str:
    """What ``repro launch --dry-run`` prints for engine lumenrl: every key the recipe writes beside the base file's
    value, the run's own keys, the notes, the environment and the command. Writes nothing."""
    settings = lumenrl_config.recipe_settings(recipe)
    base_path = launch.base_config_path(recipe) if recipe.lumenrl.path else None
    base = lumenrl_config.read_base_config(base_path) if base_path and base_path.is_file() else None
    lines = [f"engine: lumenrl -- AMD's LumenRL from {recipe.lumenrl.path or '(lumenrl.path not set)'}",
             f"config written over {base_path if base is not None else '(no base config here to compare with)'}", ""]
    width = max(len(k) for k in settings)
    lines.append(f"{'key (decided by the recipe)':<{width}}  {'written':<22} {'base file' if base else ''}")
    for key, value in settings.items():
        if base is None:
            lines.append(f"{key:<{width}}  {value!r}")
            continue
        published = lumenrl_config.get_key(base, key, ABSENT)
        if published is ABSENT:
            lines.append(f"{key:<{width}}  {value!r:<22} (not in the file: LumenRL's default applies there)")
            continue
        mark = "" if published == value else "   <- differs"
        lines.append(f"{key:<{width}}  {value!r:<22} {published!r}{mark}")
    lines += ["", "keys this run decides:"]
    root = checkpoint_root(recipe, run_dir).resolve()
    lines += [f"  {k} = {v!r}" for k, v in lumenrl_config.run_settings(recipe, root, resume=False).items()]
    lines += [f"note: {n}" for n in lumenrl_config.config_notes(recipe)]
    if recipe.lumenrl.path:
        env = launch.lumenrl_env(recipe)
        command = launch.lumenrl_command(recipe, run_dir.resolve() / WORK / "config.yaml")
        lines += ["", "environment (over this shell's):"] + [f"  {k}={v}" for k, v in env.items()]
        lines += ["", f"command (from {launch.checkout_dir(recipe)}):", "  " + " ".join(command)]
        lines += [f"missing here: {p}" for p in launch.checkout_problems(recipe)]
    return "\n".join(lines)
