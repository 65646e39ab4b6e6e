"""An engine's side of a weight sync: the gate that keeps it from generating off a half-applied update, the
checked stream applied bucket by bucket, and the sync's stats."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Protocol

import torch

from repro.sync.errors import BucketError, SyncError
from repro.sync.stream import PackedBucket, verified_stream


@dataclass(frozen=True)
class SyncStats:
    version: int
    buckets: int
    tensors: int
    nbytes: int
    seconds: float

    @property
    def gbps(self) -> float:
        """GB/s (10^9 bytes) over transport, checks and the engine's apply (FP8 re-quantisation included)."""
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else float("nan")


class SyncGate:
    """Whether an engine may generate: closed from ``begin`` until ``finish``; a ``fail``ed sync keeps it closed,
    with the failure's message, until a later sync finishes."""

    def __init__(self):
        self.syncing: int | None = None
        self.failure: str | None = None

    def begin(self, version: int) -> None:
        self.syncing = version

    def fail(self, message: str) -> None:
        self.failure = message

    def finish(self) -> None:
        self.syncing, self.failure = None, None

    def check(self, error: type[Exception]) -> None:
        if self.failure is not None:
            raise error(f"generate refused: weight sync v{self.syncing} failed ({self.failure}); the engine holds a "
                        "partly applied update until a complete sync succeeds")
        if self.syncing is not None:
            raise error(f"generate refused: syncing weights v{self.syncing}")


class SyncTarget(Protocol):
    """What ``apply_stream`` drives: every rollout engine (``repro.rollout.base.RolloutEngine``) is one."""

    gate: SyncGate

    def begin_sync(self, version: int) -> None:
        """Close the gate: from here until ``finish_sync`` the engine may hold a mix of versions."""

    def apply_bucket(self, named: list[tuple[str, torch.Tensor]], version: int, label: str) -> None:
        """Check and load one bucket's tensors; an error that names ``label`` is a ``BucketError``."""

    def finish_sync(self, version: int) -> None:
        """Every tensor arrived: serve ``version`` and open the gate; else raise naming what is missing."""


def apply_stream(engine: SyncTarget, buckets: Iterable[PackedBucket], version: int, senders: int = 1) -> SyncStats:
    """Check and apply ``buckets`` bucket by bucket through ``engine.begin_sync/apply_bucket/finish_sync``; any
    failure marks the engine's gate failed (naming the bucket) and is raised. Times the whole."""
    start = time.perf_counter()
    count = tensors = nbytes = 0
    engine.begin_sync(version)
    label = "before the first bucket"
    try:
        for label, named in verified_stream(buckets, version, senders):
            engine.apply_bucket(named, version, label)
            count, tensors = count + 1, tensors + len(named)
            nbytes += sum(t.numel() * t.element_size() for _, t in named)
        label = "after the last bucket"
        engine.finish_sync(version)
    except BucketError as err:  # names its bucket already
        engine.gate.fail(str(err))
        raise
    except Exception as err:
        engine.gate.fail(f"weight sync v{version}, {label}: {err}")
        raise
    return SyncStats(version, count, tensors, nbytes, time.perf_counter() - start)


def drain(stream: Iterable) -> None:
    """Read a failed sync's stream to its end so its senders finish their broadcasts instead of blocking on a
    receiver that left; what the rest of it would have raised is moot (the sync already failed)."""
    try:
        for _ in stream:
            pass
    except SyncError:
        pass
