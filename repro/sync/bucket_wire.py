"""repro's own wire (``repro.sync.handoff.Wire``): each sending rank streams its tensors in checked byte buckets
(``repro.sync.stream``) on a collective group of its own (``repro.sync.group``: gloo, or NCCL/RCCL where the rollout
has GPUs of its own), the rollout joins every sender's group and applies the buckets as they arrive.

Any engine takes it: the buckets are applied through the engine's ``begin_sync`` / ``apply_bucket`` /
``finish_sync`` (``repro.sync.apply``) in the receiving process, or, where the engine's own workers join the groups
(``RolloutCapabilities.workers_join_groups``: a tensor-parallel engine whose every worker loads its shard), through
the engine's ``receive_from_groups``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Protocol

import torch

from repro.devices import settle
from repro.sync.apply import SyncStats, SyncTarget, apply_stream, drain
from repro.sync.group import SyncAddress, SyncGroup, free_address, receive_all
from repro.sync.stream import pack_buckets

if TYPE_CHECKING:
    from pathlib import Path

    from repro.recipes.schema import Recipe


class GroupJoiningEngine(SyncTarget, Protocol):
    def receive_from_groups(self, addresses: list[SyncAddress], version: int) -> SyncStats:
        """Every worker joins the senders' sync groups and applies the buckets itself, behind the gate."""


class BucketWire:
    """repro's bucket stream; one instance per process (a sending rank keeps its group, the rollout the ones it
    joined, from one sync to the next)."""

    def __init__(self, bucket_bytes: int, receivers: int, backend: str, timeout_s: float):
        self.bucket_bytes, self.receivers, self.backend, self.timeout_s = bucket_bytes, receivers, backend, timeout_s
        self.group: SyncGroup | None = None  # a sending rank's
        self.joined: list[SyncGroup] = []    # the rollout's

    # -- a sending trainer rank ---------------------------------------------------------------------------------
    def address(self, sender: int, host: str) -> SyncAddress:
        host, port = free_address(host)
        return SyncAddress(host, port, sender, self.receivers, self.backend, self.timeout_s)

    def send(self, named: Iterator[tuple[str, torch.Tensor]], address: SyncAddress, version: int, sender: int) -> int:
        """Every tensor, packed on the transport's device as it is read. The device is settled first: what the
        update wrote on other streams (megatron's offloaded optimizer copies parameters back on a side stream) must
        have landed before the send reads the weights. A failed send drops the group (the receivers may have left
        it half-way; the next sync forms a new one at a new address)."""
        settle()
        try:
            if self.group is None or self.group.address != address:
                self.group = SyncGroup(address, rank=0)
            return self.group.send(pack_buckets(named, self.bucket_bytes, version, sender, device=self.group.device))
        except BaseException:
            self.group = None
            raise

    # -- the rollout ----------------------------------------------------------------------------------------------
    def receive(self, engine: SyncTarget, addresses: tuple[SyncAddress, ...], version: int) -> SyncStats:
        """Every sender's buckets, sender 0 first, checked and applied; a bad bucket fails the sync and the rest of
        the stream is still drained, so the senders finish and the next sync starts clean."""
        if getattr(engine.capabilities, "workers_join_groups", False):
            joining: GroupJoiningEngine = engine  # type: ignore[assignment]
            return joining.receive_from_groups(list(addresses), version)
        known = {g.address: g for g in self.joined}
        self.joined = [known.get(a) or SyncGroup(a, rank=1) for a in addresses]
        stream = receive_all(self.joined, version)
        try:
            return apply_stream(engine, stream, version, len(addresses))
        except Exception:
            drain(stream)
            raise


def bucket_wire(recipe: "Recipe", model_dir: "str | Path | None" = None) -> BucketWire:
    """The bucket stream as the recipe sets it: bucket size, receivers per sender, the transport, the timeout."""
    from repro.recipes.backends import sync_receivers

    return BucketWire(recipe.weight_sync.bucket_mb * 1024 * 1024, sync_receivers(recipe), sync_backend(recipe),
                      recipe.weight_sync.timeout_s)


def sync_backend(recipe: "Recipe") -> str:
    """gloo on CPU lanes, and where trainer and rollout share one GPU (``cluster.colocate: gpu``: NCCL refuses two
    ranks on one device, "Duplicate GPU detected"); NCCL (RCCL on ROCm) where the rollout has GPUs of its own."""
    return "nccl" if recipe.cluster.gpus_per_node > 0 and recipe.cluster.colocate != "gpu" else "gloo"
