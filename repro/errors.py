"""Errors a user can act on. Each message names the file, field or tensor at fault."""


class ReproError(Exception):
    """Base for errors that the CLI prints as one line instead of a traceback."""


class RecipeError(ReproError, ValueError):
    """A recipe field is missing, unknown, of the wrong type, or inconsistent with another field."""


class DataError(ReproError, ValueError):
    """A dataset file or row is malformed."""


class CheckpointError(ReproError, ValueError):
    """A checkpoint folder, file or tensor is missing, malformed, or fails FP8 verification."""


class SettingRefused(ReproError):
    """A saved state was made with another setting than this run's: the message names the setting that continues it.
    Rerunning the same command would only repeat the refusal, so no "rerun with --resume" is added to it."""


class TornLineWarning(UserWarning):
    """The last line of a log was cut off (a run killed mid-write): it is dropped, the rest is read."""


class WorkerError(ReproError):
    """A worker of a group failed a call: it raised (``died`` False), or its process died or stopped answering
    (``died`` True: what it held in memory is gone, so only new workers can go on)."""

    def __init__(self, message: str, *, worker: str, call: str, cause: str, died: bool, refused: bool = False):
        super().__init__(message)
        self.worker, self.call, self.cause, self.died = worker, call, cause, died
        self.refused = refused  # the worker raised SettingRefused
