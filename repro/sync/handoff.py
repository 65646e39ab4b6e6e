"""What travels from the trainer to the rollout in a weight sync, and the seam each rollout engine's wire fills.

A sync has two ends in two processes on Ray: the trainer's sending ranks, each holding its stage's tensors one at a
time, and the rollout's engine. How the bytes cross is the rollout engine's choice -- its *wire*, made from the
recipe on both sides (``repro.recipes.backends.ROLLOUTS[...].wire`` names the function, so a sending rank knows
the wire without the engine):

    Wire.address(sender, host)            a sending rank: where its end will meet (a plain value Ray carries)
    Wire.send(named, address, version)    a sending rank: every (name, tensor) of its stage, in order
    Wire.receive(engine, addresses, v)    the rollout: the sync from every sender, applied behind the engine's gate

repro's bucket stream over its own collective groups (``repro.sync.bucket_wire.BucketWire``) serves any engine;
vLLM's weight-transfer engine is vLLM's own wire (``repro.rollout.vllm_transfer.TransferWire``). This module names
no engine. In one process there is no wire: the trainer's lazy bucket stream is applied directly (``LocalStream``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Iterator, Protocol

import torch

from repro.sync.apply import SyncStats, SyncTarget, apply_stream, drain
from repro.sync.stream import PackedBucket


@dataclass(frozen=True)
class LocalStream:
    """The trainer's bucket stream in this process, read lazily as the rollout applies it (one sender)."""

    buckets: Iterable[PackedBucket]


@dataclass(frozen=True)
class Senders:
    """On Ray: where every sending trainer rank's end of the wire meets, in sender order (what Ray carries to the
    rollout; the rollout's wire reads them)."""

    addresses: tuple[Hashable, ...]


@dataclass(frozen=True)
class RemoteSend:
    """A weight send under way on Ray: the senders' addresses, every trainer rank's send call (they must finish
    too), and what to call if the sync fails (``failed``: the trainer side forgets these addresses, so both ends
    form new groups at the next sync instead of one end waiting in a group the other left)."""

    source: Senders
    calls: list[Any]
    call_names: list[str]
    failed: Callable[[], None] = lambda: None


class Wire(Protocol):
    """How one rollout engine's weights cross from the trainer's sending ranks (see the module docstring). A sending
    rank's wire keeps its end between syncs while the address stays the same and drops it when a send fails."""

    def address(self, sender: int, host: str) -> Hashable:
        """Where sending rank ``sender``'s end will meet, on this node (a free port): a plain, picklable value."""

    def send(self, named: Iterator[tuple[str, torch.Tensor]], address: Hashable, version: int, sender: int) -> int:
        """Every tensor of ``named`` to the receivers at ``address``; returns the payload bytes sent."""

    def receive(self, engine: SyncTarget, addresses: tuple[Hashable, ...], version: int) -> SyncStats:
        """One sync from the senders at ``addresses``, applied to ``engine`` behind its gate (a failure raises and
        leaves the engine refusing to generate until a complete sync succeeds)."""


def apply_local(engine: SyncTarget, stream: LocalStream, version: int) -> SyncStats:
    """Check and apply the trainer's stream in this process; a bad bucket fails the sync (the engine then refuses to
    generate) and the rest of the stream is still drained."""
    buckets = iter(stream.buckets)
    try:
        return apply_stream(engine, buckets, version, 1)
    except Exception:
        drain(buckets)
        raise
