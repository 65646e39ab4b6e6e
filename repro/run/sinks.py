"""Where the rows of metrics.jsonl go besides that file: TensorBoard event files and W&B (the recipe's
``tracking`` section). ``MetricsLog.append`` hands every row it has written to each sink, so the three records
hold the same rows; a run without tracking has an empty list of sinks, not a branch.

Each sink gets the row as metrics.jsonl holds it and keeps its scalars (:func:`scalars`): every number but
``step``, which is the sink's step axis (the optimizer step; an evaluation sits at the step it followed).

Resume: a resumed run's log is cut back to its checkpoint (``repro.run.run_dir``). TensorBoard is told to drop
what it holds after the last kept row (``purge_step``, TensorBoard's own mechanism: its reader hides the older
events from that step on), so its steps then match the log. W&B's steps only increase, so the run (its id kept
in ``wandb/run_id``) continues from what W&B's own files hold: the kept rows it lacks are sent at the start (W&B
buffers its transaction log in 32 KiB blocks, so a killed run loses its last few steps there) and rows of steps
it already holds are not sent again -- those steps keep the crashed attempt's numbers, which equal the
recomputed ones except wall-clock timings (the resume is deterministic: tests/test_loop_resume.py). W&B gets each
step whole (:class:`WandbSink`), so a step it holds is never missing the evaluation that followed it.

A sink that cannot start fails before the first step, naming the recipe field (:func:`check_sinks`).
"""

from __future__ import annotations

import json
import secrets
import string
import subprocess
import sys
from pathlib import Path
from typing import Protocol

from repro.errors import ReproError
from repro.owned import write_atomic
from repro.recipes.backends import engine_of
from repro.recipes.schema import Recipe, WandbTracking

TENSORBOARD_DIR = "tensorboard"
ROLLOUTS_DIR = "rollouts"  # each step's trajectories (repro.run.rollouts_file writes them)
WANDB_DIR = "wandb"
RUN_ID_FILE = "run_id"


class Sink(Protocol):
    def log(self, row: dict) -> None: ...
    def close(self, exit_code: int = 0) -> None: ...


def scalars(row: dict) -> dict[str, float]:
    """The row's numbers (not ``step``, ``kind``, lists, or the nulls a non-finite value is logged as)."""
    return {k: v for k, v in row.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def check_sinks(recipe: Recipe, run_dir: Path) -> None:
    """Fail now, naming the field, if a sink the recipe asks for cannot start: its package is missing or its
    folder cannot be written. (engine lumenrl: LumenRL runs in this interpreter, so its W&B logger needs the same
    wandb; without it LumenRL would only warn and log nothing.)"""
    tracking = recipe.tracking
    if tracking.tensorboard:
        _require("tracking.tensorboard", "torch.utils.tensorboard", "tensorboard")
        _writable("tracking.tensorboard", run_dir / TENSORBOARD_DIR)
    if tracking.wandb.enabled:
        _require("tracking.wandb.enabled", "wandb", "wandb")
        _writable("tracking.wandb.enabled", run_dir / WANDB_DIR)
    if tracking.rollouts and engine_of(recipe).own_loop:  # LumenRL's trajectories stay in its processes
        _writable("tracking.rollouts", run_dir / ROLLOUTS_DIR)


def _require(field: str, module: str, extra: str) -> None:
    import importlib

    try:
        importlib.import_module(module)
    except ImportError as err:
        raise ReproError(f"{field}: {module} cannot be imported ({err}); pip install 'repro[{extra}]', "
                         f"or set {field}=false") from None


def _writable(field: str, folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ReproError(f"{field}: cannot write {folder} ({err.strerror or err})") from None


def open_sinks(recipe: Recipe, run_dir: Path, kept_rows: list[dict]) -> list[Sink]:
    """The recipe's sinks, started; ``kept_rows`` are the rows the log holds now (a resume's, up to its
    checkpoint; none for a new run)."""
    sinks: list[Sink] = []
    last_kept = max((r["step"] for r in kept_rows), default=None)
    if recipe.tracking.tensorboard:
        sinks.append(TensorBoardSink(run_dir / TENSORBOARD_DIR, 0 if last_kept is None else last_kept + 1))
    # with engine lumenrl, LumenRL logs to W&B itself (repro.lumenrl.tracking); config: the resolved recipe
    if recipe.tracking.wandb.enabled and engine_of(recipe).own_loop:
        sinks.append(WandbSink(recipe.tracking.wandb, run_dir, recipe.model_dump(mode="json"), kept_rows))
    return sinks


class TensorBoardSink:
    """Scalars as float64 tensors (``double_precision``: TensorBoard reads back the logged number exactly), one
    event file per process, flushed after every row."""

    def __init__(self, log_dir: Path, purge_step: int):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def log(self, row: dict) -> None:
        for key, value in scalars(row).items():
            self.writer.add_scalar(key, value, global_step=row["step"], new_style=True, double_precision=True)
        self.writer.flush()

    def close(self, exit_code: int = 0) -> None:
        self.writer.close()


def new_run_id() -> str:
    """A W&B run id: 8 characters of [a-z0-9], as W&B makes its own."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def wandb_run_id(run_dir: Path) -> str:
    """The run's W&B id, kept in ``<run_dir>/wandb/run_id`` (made on first use), so every attempt of the run --
    and LumenRL's logger, with engine lumenrl -- continues the same W&B run."""
    path = run_dir / WANDB_DIR / RUN_ID_FILE
    if path.is_file():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, new_run_id() + "\n")  # never through a link
    return path.read_text().strip()


def wandb_steps_held(run_dir: Path, run_id: str) -> list[int]:
    """The history steps W&B's own files under ``<run_dir>/wandb`` hold for ``run_id``, every attempt's, in file
    order; read with W&B's reader of its transaction log (``wandb leet inspect --json``)."""
    steps = []
    for log in sorted((run_dir / WANDB_DIR).glob(f"*-{run_id}/run-{run_id}.wandb")):
        done = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(log)],
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise ReproError(f"tracking.wandb.enabled: W&B cannot read its own log {log} "
                             f"({(done.stderr or done.stdout).strip()[-300:]}); move that run folder aside to resume")
        for line in done.stdout.splitlines():
            record = json.loads(line)
            if record.get("type") == "history":
                steps.append(int(record["history"].get("step", {}).get("num", 0)))  # proto3 omits a 0
    return steps


class WandbSink:
    """The run in W&B (mode offline: files under ``<run_dir>/wandb``, ``wandb sync`` uploads them).

    A step reaches W&B whole: its rows (the train row, then the evaluation after it) are held until a row of a
    later step arrives, or the run ends well. A run that fails drops the step it was in, which the resume
    recomputes or sends from the log; W&B could take no later row of a step it had committed."""

    def __init__(self, settings: WandbTracking, run_dir: Path, config: dict, kept_rows: list[dict]):
        import wandb

        run_id = wandb_run_id(run_dir)
        self.held = max(wandb_steps_held(run_dir, run_id), default=-1)
        self.pending: list[dict] = []
        try:
            self.run = wandb.init(
                project=settings.project, entity=settings.entity, name=settings.name or run_dir.resolve().name,
                id=run_id, resume="allow", mode=settings.mode, dir=str(run_dir), config=config,
                settings=wandb.Settings(console="off", quiet=True, disable_git=True, save_code=False),
            )
        except Exception as err:  # wandb raises its own errors (no login in online mode, a bad entity ...)
            raise ReproError(f"tracking.wandb: W&B did not start in mode {settings.mode!r} ({err})") from None
        for row in kept_rows:  # what W&B lost of the kept log (module docstring)
            self.log(row)

    def log(self, row: dict) -> None:
        if row["step"] <= self.held:
            return
        if self.pending and self.pending[0]["step"] != row["step"]:
            self._send()
        self.pending.append(row)

    def _send(self) -> None:
        step = self.pending[0]["step"]
        self.run.log({k: v for row in self.pending for k, v in scalars(row).items()}, step=step)
        self.pending, self.held = [], step

    def close(self, exit_code: int = 0) -> None:
        if self.pending and exit_code == 0:
            self._send()
        self.run.finish(exit_code=exit_code)
