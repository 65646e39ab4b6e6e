"""The collective groups a weight sync runs over: one per sending trainer rank, holding that rank and every
rollout receiver (slime's scheme: each pipeline stage streams its own layers on a group of its own; LumenRL's
single sender is the one-group case).

Each group has its own rendezvous -- a ``TCPStore`` the sender hosts at an address Ray hands the receivers -- and
its own process group built directly on that store (``ProcessGroupGloo`` here; ``ProcessGroupNCCL`` on GPUs,
which RCCL serves on ROCm), so it never touches the trainer's default torch.distributed group, and calls go to
the group object with group-local ranks (sender 0, receivers 1..R). On the wire, per bucket: two int64 (header
length, payload length), the JSON header as bytes, the payload; nothing pickled. A receiver whose sender dies or
stalls gets the transport's error (a reset connection, or the group's timeout) as a ``SyncError`` naming the
version and the bucket it was waiting for.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Iterable, Iterator

import torch
import torch.distributed as dist

from repro.devices import collective_device
from repro.sync.errors import BucketError, SyncError
from repro.sync.stream import BucketHeader, PackedBucket


@dataclass(frozen=True)
class SyncAddress:
    """Where sender ``sender``'s group meets: plain values, carried by Ray (or a test) to every member."""

    host: str
    port: int
    sender: int
    receivers: int
    backend: str = "gloo"          # "gloo", or "nccl" (NCCL / RCCL) with CUDA or ROCm devices
    timeout_s: float = 7200.0

    @property
    def world(self) -> int:
        return 1 + self.receivers


def free_address(host: str | None = None) -> tuple[str, int]:
    """This node's address and a port free now (the sender binds it moments later)."""
    host = host or socket.gethostbyname(socket.gethostname())
    with socket.socket() as sock:
        sock.bind(("", 0))
        return host, sock.getsockname()[1]


def _gloo(store: dist.Store, rank: int, world: int, timeout: timedelta) -> dist.ProcessGroup:
    return dist.ProcessGroupGloo(store, rank, world, timeout)


def _nccl(store: dist.Store, rank: int, world: int, timeout: timedelta) -> dist.ProcessGroup:
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return dist.ProcessGroupNCCL(store, rank, world, options)


@dataclass(frozen=True)
class Transport:
    build: Callable[[dist.Store, int, int, timedelta], dist.ProcessGroup]
    backend: str  # the collective backend, which decides where its tensors live (repro.devices.collective_device)

    @property
    def on_host(self) -> bool:
        """Whether it carries host tensors (gloo), else device ones (NCCL, RCCL on ROCm)."""
        return self.backend != "nccl"

    def device(self) -> torch.device:
        """Where every tensor of a broadcast must be: this process's current GPU for NCCL, the host for gloo."""
        return collective_device(self.backend)


# SyncAddress.backend -> its transport
PROCESS_GROUPS = {"gloo": Transport(_gloo, "gloo"), "nccl": Transport(_nccl, "nccl")}


class SyncGroup:
    """One sender's group, from one member's side: ``rank`` 0 is the sender, 1..R the receivers."""

    def __init__(self, address: SyncAddress, rank: int):
        if not 0 <= rank < address.world:
            raise SyncError(f"sync group of sender {address.sender}: rank {rank} outside 0..{address.world - 1}")
        if address.backend not in PROCESS_GROUPS:
            raise SyncError(f"weight sync backend {address.backend!r}: one of {sorted(PROCESS_GROUPS)}")
        transport = PROCESS_GROUPS[address.backend]
        # the transport decides where this member's tensors live (NCCL: its current GPU), not the caller
        self.address, self.rank, self.device = address, rank, transport.device()
        timeout = timedelta(seconds=address.timeout_s)
        try:
            store = dist.TCPStore(address.host, address.port, address.world, is_master=rank == 0, timeout=timeout)
            store = dist.PrefixStore(f"repro-weight-sync-{address.sender}", store)
            self.pg = transport.build(store, rank, address.world, timeout)
        except (RuntimeError, dist.DistError) as err:
            raise SyncError(f"sync group of sender {address.sender} at {address.host}:{address.port} did not form "
                            f"as rank {rank} of {address.world}: {err}") from err
        self._store = store  # the sender hosts the rendezvous: keep it alive with the group

    def _broadcast(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        """Broadcast ``tensor`` from rank 0 in place. As strict as ProcessGroupNCCL on every transport: a tensor that
        is not on the group's device is refused (gloo would copy it silently; NCCL throws), never moved here."""
        if tensor.device != self.device:
            raise SyncError(f"sync group of sender {self.address.sender} ({self.address.backend}): {what} is on "
                            f"{tensor.device}, the transport carries {self.device} tensors")
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = 0, 0
        self.pg.broadcast([tensor], options).wait()
        return tensor

    def send(self, buckets: Iterable[PackedBucket]) -> int:
        """Broadcast every bucket (the stream must end with its end marker); returns the payload bytes sent."""
        if self.rank != 0:
            raise SyncError(f"sync group of sender {self.address.sender}: rank {self.rank} is a receiver")
        sent = 0
        for bucket in buckets:
            header = bucket.header.encode()
            self._broadcast(torch.tensor([len(header), bucket.header.nbytes], dtype=torch.int64, device=self.device),
                            "the sizes")
            self._broadcast(torch.frombuffer(bytearray(header), dtype=torch.uint8).to(self.device), "the header")
            if bucket.header.nbytes:
                self._broadcast(bucket.payload, f"the payload of {bucket.label}")
            sent += bucket.header.nbytes
            del bucket  # the sender makes the next bucket with this one freed: two buckets at most
        return sent

    def receive(self, version: int) -> Iterator[PackedBucket]:
        """This sender's buckets as they arrive, through its end marker (payloads on this member's device)."""
        index = 0
        while True:
            where = f"weight sync v{version}: bucket {index} of sender {self.address.sender}"
            try:
                sizes = self._broadcast(torch.zeros(2, dtype=torch.int64, device=self.device), "the sizes").cpu()
                header_len, nbytes = int(sizes[0]), int(sizes[1])
                raw = self._broadcast(torch.empty(header_len, dtype=torch.uint8, device=self.device), "the header")
                header = BucketHeader.decode(raw.cpu().numpy().tobytes(), where)
                # the payload stays where the transport put it (the GPU on NCCL): the checksum and the engine's
                # load_weights read it there
                payload = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
                if nbytes:
                    payload = self._broadcast(payload, "the payload")
            except (RuntimeError, dist.DistError) as err:
                raise BucketError(f"{where}: the transport failed while it was on its way "
                                f"(sender dead or stalled past {self.address.timeout_s:g} s?): {err}") from err
            yield PackedBucket(header, payload)
            if header.end:
                return
            index += 1


def receive_all(groups: list[SyncGroup], version: int) -> Iterator[PackedBucket]:
    """Every sender's stream, sender 0 first (``repro.sync.stream.verified_stream`` expects that order)."""
    for group in sorted(groups, key=lambda g: g.address.sender):
        yield from group.receive(version)
