"""When a run stops at a step, and when it restarts itself.

Whatever fails inside step N -- a worker's call, a checkpoint or a log line that cannot be written -- leaves the
loop as ``StepFailed``, naming the step and what failed (the worker and its call, or the file). The one entry
point (``repro.run.start.run_repro``) then asks ``Restarts``: a worker that *died* (its process is gone or stopped
answering) may be replaced, up to ``checkpoint.max_restarts`` times: both groups are ended, new ones started, the
run resumes from the newest complete checkpoint and a ``restart`` row goes into metrics.jsonl. Anything else, a
death once the restarts are used up, or the same worker dying in the same call at the same step as the fault
before it (a fault that repeats is not cured by restarting) stops the run with ``RunStopped``, which names the
step, the worker (process id, host, log file) or the file, and the checkpoint to resume from.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from repro.errors import ReproError, SettingRefused, WorkerError

RESTART = "restart"  # the metrics row kind of a restart


class StepFailed(ReproError):
    """Step ``step`` of the run failed with ``cause`` (step 0: the evaluation before the first update; during a
    start or a resume: the step it starts from)."""

    def __init__(self, step: int, cause: Exception):
        self.step, self.cause = step, cause
        super().__init__(f"step {step}: {describe(cause)}")

    @property
    def worker_died(self) -> bool:
        return isinstance(self.cause, WorkerError) and self.cause.died

    @property
    def refused(self) -> bool:
        """A setting refused the saved state: the message says what to set, and a plain resume would repeat it."""
        cause = self.cause
        return isinstance(cause, SettingRefused) or (isinstance(cause, WorkerError) and cause.refused)

    @property
    def key(self) -> tuple:
        """What makes two faults the same one: the step, and the worker and call (or the error's text)."""
        if isinstance(self.cause, WorkerError):
            return self.step, self.cause.worker, self.cause.call
        return self.step, type(self.cause).__name__, str(self.cause)


class RunStopped(ReproError):
    """The run stopped on ``failure`` and did not restart; the message says why and where to resume."""

    def __init__(self, message: str, failure: StepFailed):
        super().__init__(message)
        self.failure = failure


def describe(err: Exception) -> str:
    if isinstance(err, OSError) and err.filename:
        return f"{err.strerror or err} writing {err.filename}"
    return str(err)


@contextmanager
def at_step(step: int) -> Iterator[None]:
    """Everything the run can meet at ``step`` (a worker's failure, a write that fails) raised as ``StepFailed``;
    a bug (any other exception) keeps its own traceback."""
    try:
        yield
    except StepFailed:
        raise
    except (ReproError, OSError) as err:
        raise StepFailed(step, err) from err


def explain(failure: StepFailed, workers: dict[str, dict]) -> str:
    """The failure with the failed worker's process (id, host, log file) from the run's record of its workers."""
    text = str(failure)
    if isinstance(failure.cause, WorkerError) and failure.cause.worker in workers:
        info = workers[failure.cause.worker]
        where = f"pid {info['pid']} on {info['host']}" + (f", its output: {info['log']}" if info.get("log") else "")
        text += f" [{failure.cause.worker}: {where}]"
    return text


@dataclass
class Restarts:
    """The restarts a run may still make (``checkpoint.max_restarts``) and the fault behind the last one."""

    limit: int
    done: int = 0
    last: StepFailed | None = None
    pending: dict | None = field(default=None, repr=False)  # the row of a restart not yet logged

    def allow(self, failure: StepFailed, workers: dict[str, dict], resume_hint: str) -> str:
        """The line to show for a restart this failure gets; raises ``RunStopped`` when it gets none."""
        text = explain(failure, workers)
        if failure.refused:
            raise RunStopped(text, failure)
        if not failure.worker_died:
            raise RunStopped(f"{text}; {resume_hint}", failure)
        if self.last is not None and failure.key == self.last.key:
            raise RunStopped(
                f"{text}; the same fault stopped the run at step {failure.step} before restart {self.done}, so "
                f"another restart would only repeat it: not restarting again; {resume_hint}", failure)
        if self.done >= self.limit:
            why = (f"all {self.limit} restarts (checkpoint.max_restarts) are used" if self.limit else
                   "the run does not restart itself (checkpoint.max_restarts 0; --max-restarts N lets it)")
            raise RunStopped(f"{text}; {why}; {resume_hint}", failure)
        self.done, self.last = self.done + 1, failure
        cause = failure.cause
        self.pending = {"kind": RESTART, "step": failure.step, "attempt": self.done, "max_restarts": self.limit,
                        "worker": cause.worker, "call": cause.call, "cause": text}
        return (f"restart {self.done} of {self.limit}: {text}; ending both groups, starting new ones and resuming "
                "from the newest complete checkpoint")

    def log_pending(self, metrics, resumed_from: int) -> None:
        """Append the pending restart's row (once the resume has restored the log, so the row stays in it)."""
        if self.pending is not None:
            metrics.append({**self.pending, "resumed_from": resumed_from})
            self.pending = None
