"""What travels from the trainer to the rollout in a weight sync, and the one place the rollout side tells it apart.

``WeightSource`` is one of three plain values:

    LocalStream      in one process: the trainer's lazy bucket stream (one sender)
    SenderGroups     on Ray: where each sending trainer rank's collective group meets (``repro.sync.group``)
    TransferAddress  on Ray with vLLM on GPUs and one sender: vLLM's own weight-transfer group
                     (``repro.rollout.vllm_transfer``)

``SenderEnd.send`` sends a trainer rank's weights to a Ray-side source, ``receive`` takes any of them to a
rollout engine: the stream or the groups' buckets are checked and applied
bucket by bucket here (``repro.sync.apply.apply_stream``), unless the engine's workers join the groups
themselves (``RolloutCapabilities.workers_join_groups``: vLLM) or the serving library carries the transfer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Union

import torch

from repro.devices import settle
from repro.rollout.base import RolloutEngine
from repro.rollout.vllm_transfer import TransferAddress, TransferSender
from repro.sync.apply import SyncStats, apply_stream, drain
from repro.sync.group import SyncAddress, SyncGroup, receive_all
from repro.sync.stream import PackedBucket, pack_buckets


@dataclass(frozen=True)
class LocalStream:
    """The trainer's bucket stream in this process, read lazily as the rollout applies it (one sender)."""

    buckets: Iterable[PackedBucket]


@dataclass(frozen=True)
class SenderGroups:
    """Where each sending trainer rank's sync group meets, in sender order (plain values Ray carries)."""

    addresses: tuple[SyncAddress, ...]


WeightSource = Union[LocalStream, SenderGroups, TransferAddress]


@dataclass(frozen=True)
class RemoteSend:
    """A weight send under way on Ray: what the rollout receives from, every trainer rank's send call (they must
    finish too), and what to call if the sync fails (``failed``: the trainer side forgets these addresses, so both
    ends form new groups at the next sync instead of one end waiting in a group the other left)."""

    source: SenderGroups | TransferAddress
    calls: list[Any]
    call_names: list[str]
    failed: Callable[[], None] = lambda: None


def remote_source(addresses: list[SyncAddress | TransferAddress]) -> SenderGroups | TransferAddress:
    """The senders' addresses (``TrainerWorker.sync_address`` of every sending rank) as one source: vLLM's
    transfer group when the one sender asked for it, else the senders' own groups."""
    if len(addresses) == 1 and isinstance(addresses[0], TransferAddress):
        return addresses[0]
    return SenderGroups(tuple(addresses))


class SenderEnd:
    """A sending trainer rank's end of the sync on Ray: its own sync group, or vLLM's transfer sender, each formed
    on first use and kept while the address stays the same. A failed send drops it: the receivers may have left the
    group half-way, so the next sync forms a new one (the driver hands out new addresses: ``RemoteSend.failed``)."""

    def __init__(self, bucket_bytes: int):
        self.bucket_bytes = bucket_bytes
        self.group: SyncGroup | None = None
        self.transfer: TransferSender | None = None

    def send(self, named: Iterator[tuple[str, torch.Tensor]], address: SyncAddress | TransferAddress, version: int,
             sender: int) -> int:
        """Every tensor of ``named`` to ``address``'s receivers; returns the payload bytes sent. The device is
        settled first: what the update wrote on other streams (megatron's offloaded optimizer copies parameters
        back on a side stream) must have landed before the send reads the weights (vLLM packs on streams of its own
        that never wait on the default one; verl synchronises before broadcasting too)."""
        settle()
        try:
            if isinstance(address, TransferAddress):
                if self.transfer is None or self.transfer.address != address:
                    self.transfer = TransferSender(address)
                return self.transfer.send(named, version)
            if self.group is None or self.group.address != address:
                self.group = SyncGroup(address, rank=0)
            return self.group.send(pack_buckets(named, self.bucket_bytes, version, sender, device=self.group.device))
        except BaseException:
            self.group = self.transfer = None
            raise


class JoinedGroups:
    """The sync groups a receiver has joined, kept from one sync to the next (a group forms once)."""

    def __init__(self):
        self.groups: list[SyncGroup] = []

    def join(self, addresses: tuple[SyncAddress, ...]) -> list[SyncGroup]:
        known = {g.address: g for g in self.groups}
        self.groups = [known.get(a) or SyncGroup(a, rank=1) for a in addresses]
        return self.groups


def receive(engine: RolloutEngine, source: WeightSource, version: int, joined: JoinedGroups) -> SyncStats:
    """Check and apply one sync from ``source``. A bad bucket fails the sync and leaves the engine refusing to
    generate; the rest of the stream is still drained, so the senders finish and the next sync starts clean."""
    if isinstance(source, TransferAddress):
        return engine.receive_transfer(source, version)
    if isinstance(source, SenderGroups) and engine.capabilities.workers_join_groups:
        return engine.receive_from_groups(list(source.addresses), version)
    if isinstance(source, SenderGroups):
        stream, senders = receive_all(joined.join(source.addresses), version), len(source.addresses)
    else:
        stream, senders = iter(source.buckets), 1
    try:
        return apply_stream(engine, stream, version, senders)
    except Exception:
        drain(stream)
        raise
