"""Weight sync, trainer -> rollout: named tensors in size-capped buckets, verified whole before any is applied.

AMD streams the BF16 actor's weights to the rollout node over RDMA in 2,048 MB buckets and converts them to
FP8 there. Here a bucket is a plain record that any transport can carry (Ray's object store on one machine):
the sender cuts the named tensors into buckets of at most ``bucket_bytes`` (a tensor larger than that gets a
bucket of its own), tagging each with the weight version, its index, the bucket count, the tensor names and
a CRC-32 of every tensor's bytes. The receiver checks each bucket (version, count, names, checksums) and only
when the whole set has arrived and checked out hands the tensors to the engine, whose ``update_weights``
re-quantises them to FP8 and swaps all at once: the rollout never generates from a half-applied update.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch

from repro.errors import ReproError


class SyncError(ReproError):
    """A weight-sync bucket is missing, duplicated, from another version, or corrupt."""


@dataclass(frozen=True)
class Bucket:
    version: int
    index: int
    count: int                      # buckets in this version's sync
    tensors: dict[str, torch.Tensor]
    checksums: dict[str, int]       # name -> CRC-32 of the tensor's bytes as sent

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def tensor_crc32(tensor: torch.Tensor) -> int:
    """CRC-32 of the tensor's raw bytes (dtype-agnostic: viewed as uint8)."""
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    return zlib.crc32(flat.numpy().tobytes()) if flat.numel() else 0


def make_buckets(named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int, version: int) -> list[Bucket]:
    """Group tensors, in order, into buckets of at most ``bucket_bytes`` (one oversize tensor per bucket)."""
    if bucket_bytes <= 0:
        raise SyncError(f"bucket size must be positive, got {bucket_bytes} bytes")
    groups: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if groups[-1] and size + nbytes > bucket_bytes:
            groups.append({})
            size = 0
        groups[-1][name] = tensor.detach().cpu()
        size += nbytes
    if not groups[-1]:
        raise SyncError(f"weight sync v{version}: no tensors to send")
    return [
        Bucket(version, i, len(groups), group, {n: tensor_crc32(t) for n, t in group.items()})
        for i, group in enumerate(groups)
    ]


@dataclass(frozen=True)
class SyncStats:
    version: int
    buckets: int
    tensors: int
    nbytes: int
    seconds: float

    @property
    def gbps(self) -> float:
        """GB/s (10^9 bytes) over verification and the engine's update (FP8 re-quantisation included)."""
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else float("nan")


def verified_tensors(buckets: list[Bucket], version: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Check a complete bucket set of one version; yield its tensors only if every check passed."""
    if not buckets:
        raise SyncError(f"weight sync v{version}: no buckets arrived")
    count = buckets[0].count
    seen = sorted(b.index for b in buckets)
    if seen != list(range(count)):
        raise SyncError(f"weight sync v{version}: expected buckets 0..{count - 1}, got indices {seen}")
    names: set[str] = set()
    for bucket in buckets:
        if bucket.version != version or bucket.count != count:
            raise SyncError(
                f"weight sync v{version}: bucket {bucket.index} belongs to v{bucket.version} of {bucket.count} buckets"
            )
        if set(bucket.tensors) != set(bucket.checksums):
            raise SyncError(f"weight sync v{version}: bucket {bucket.index} lists {len(bucket.checksums)} "
                            f"checksums for {len(bucket.tensors)} tensors")
        for name, tensor in bucket.tensors.items():
            if name in names:
                raise SyncError(f"weight sync v{version}: tensor {name} arrived twice")
            names.add(name)
            if tensor_crc32(tensor) != bucket.checksums[name]:
                raise SyncError(f"weight sync v{version}: tensor {name} in bucket {bucket.index} fails its checksum")
    for bucket in sorted(buckets, key=lambda b: b.index):
        yield from bucket.tensors.items()


def apply_buckets(engine, buckets: list[Bucket], version: int) -> SyncStats:
    """Verify the whole set, then let the engine convert (FP8) and swap. Times both."""
    start = time.perf_counter()
    named = list(verified_tensors(buckets, version))
    engine.update_weights(named, version)
    return SyncStats(version, len(buckets), len(named), sum(b.nbytes for b in buckets), time.perf_counter() - start)
