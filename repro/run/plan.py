"""What every engine's run decides first (``RunPlan``) and hands back (``RunOutcome``), the SIGTERM guard both
run under, and the smoke run's length. The engines (``repro.run.start`` for repro's own loop, ``repro.lumenrl.run``
for AMD's LumenRL) share these, so neither imports the other; ``repro.engines`` chooses between them.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:  # a type here only: run.checkpoints imports torch, and this module is read by `repro smoke --help`
    from repro.run.checkpoints import Checkpoint

SMOKE_STEPS = 3  # AMD's smoke test: three optimizer steps before the long run


@dataclass(frozen=True)
class RunOutcome:
    run_dir: Path
    start_step: int       # the step the run resumed from (0: a fresh run)
    end_step: int         # the last step in the log now
    warmup_s: float       # starting the groups (workers built, weights loaded)
    seconds: float        # the whole call
    already_finished: bool = False


@dataclass(frozen=True)
class RunPlan:
    """What a call will do with a run directory, decided once before anything starts."""

    run_dir: Path
    resume: bool
    fresh: bool | str            # start over: True, or "delete-run" for more than a smoke run (repro.run.folder)
    checkpoint: Checkpoint | None  # the one a resume continues from (None: start from step 0)
    finished: bool               # resuming a run whose newest checkpoint is already at the recipe's last step
    kept_rows: list[dict]        # train rows of the log up to that checkpoint (a live plot's earlier points)
    dropped_steps: list[int]     # train steps logged after that checkpoint: dropped, then recomputed
    ignored: list[str] = field(default_factory=list)  # checkpoint folders a resume does not use, each with why

    def describe(self) -> str:
        if self.finished:
            return f"{self.run_dir}: the run is finished (checkpoint step {self.checkpoint.step}); nothing to do"
        if not self.resume:
            return f"{self.run_dir}: a new run" + (" (fresh: the earlier run's files are removed first, as listed "
                                                   "next)" if self.fresh else "")
        ignored = "".join(f"; not used: {note}" for note in self.ignored)
        if self.checkpoint is None:
            return f"{self.run_dir}: no checkpoint that verifies yet, so the run starts again from step 0{ignored}"
        note = f"resuming from step {self.checkpoint.step} (checkpoint {self.checkpoint.path}){ignored}"
        if self.dropped_steps:
            first, last = self.dropped_steps[0], self.dropped_steps[-1]
            note += (f"; step {first} logged after it is dropped and recomputed" if first == last else
                     f"; steps {first}-{last} logged after it are dropped and recomputed")
        return note


@contextmanager
def terminate_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit while the run is on, so the clean-up (placement, the local Ray instance) runs as
    it does on Ctrl-C; Python's default SIGTERM ends the process without running any of it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

