"""Weight sync, trainer -> rollout: full tensors streamed in flat byte buckets, each checked as it arrives.

AMD streams the BF16 actor's weights to the rollout node over RDMA in 2,048 MB buckets and converts them to
FP8 there. Here a sender turns its named tensors (produced one at a time, in the served checkpoint's names)
into ``PackedBucket``s: a flat uint8 payload of at most ``bucket_bytes`` (a larger tensor travels alone) and a
small JSON header -- version, sender, bucket index, each tensor's name/dtype/shape/offset, and a checksum of the
payload. No tensor is pickled: the header is JSON, the payload raw bytes, rebuilt on arrival as views.
Payloads stay on the device their tensors are on (a GPU trainer's buckets are GPU buffers, received into GPU
buffers on NCCL): the bytes cross PCIe only where the transport needs host memory (gloo). The checksum runs
where the bytes are, as one torch reduction (``payload_checksum``), so no receiver copies a bucket to the host
to check it.
Each sender ends its stream with an end marker (a header with ``end`` set and no payload).

Any transport carries the buckets in order: an iterator in one process, or a collective group made for the
sync (``repro.sync.group``: gloo here, NCCL/RCCL on GPUs). ``verified_stream`` checks every bucket on arrival
(version, sender, the next index, checksum, no tensor twice) and yields its tensors; the first bad one raises a
``BucketError`` naming the version and the bucket. Engines apply bucket by bucket between ``SyncGate.begin`` and
``SyncGate.finish`` (``repro.sync.apply``); a sync that fails half-way leaves the gate closed, so the engine refuses
to generate (naming the version and the bucket) until a complete sync succeeds: no rollout samples from a
half-applied update.

Measured vs estimated: the checksum's cost and the transport's GB/s are measured by
``benchmarks/bench_weight_sync.py``; the cluster figures it prints beside them are labelled estimates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch

from repro.sync.errors import BucketError, SyncError

# dtypes a bucket may carry, by the name a header spells them with (no getattr on text from the wire)
WIRE_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e4m3fnuz,
    torch.float8_e5m2, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}


ALIGN = 64  # byte alignment of each tensor in a payload (any dtype's element size divides it)


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int                     # byte offset in the bucket's payload
    nbytes: int


@dataclass(frozen=True)
class BucketHeader:
    version: int
    sender: int                     # which sending trainer rank (0.. senders-1; a pipeline stage)
    index: int                      # this sender's bucket number, from 0; the end marker takes the next
    entries: tuple[TensorEntry, ...]
    nbytes: int                     # payload length
    checksum: int                   # payload_checksum of the payload
    end: bool = False               # the sender's end marker: no entries, no payload

    def encode(self) -> bytes:
        return json.dumps({
            "version": self.version, "sender": self.sender, "index": self.index, "nbytes": self.nbytes,
            "checksum": self.checksum, "end": self.end,
            "entries": [[e.name, e.dtype, list(e.shape), e.offset, e.nbytes] for e in self.entries],
        }).encode()

    @classmethod
    def decode(cls, data: bytes, where: str) -> "BucketHeader":
        try:
            raw = json.loads(data)
            entries = tuple(TensorEntry(str(n), str(d), tuple(int(x) for x in s), int(o), int(b))
                            for n, d, s, o, b in raw["entries"])
            return cls(int(raw["version"]), int(raw["sender"]), int(raw["index"]), entries, int(raw["nbytes"]),
                       int(raw["checksum"]), bool(raw["end"]))
        except (ValueError, KeyError, TypeError) as err:
            raise BucketError(f"{where}: unreadable bucket header ({err})") from err


@dataclass(frozen=True)
class PackedBucket:
    header: BucketHeader
    payload: torch.Tensor           # 1-D uint8, header.nbytes long

    @property
    def label(self) -> str:
        h = self.header
        return f"bucket {h.index} of sender {h.sender}"


CHECKSUM_BLOCK = 512  # int64 words (4 KiB) per block of the checksum's position-weighted sum
_MASK64 = (1 << 64) - 1


def payload_checksum(payload: torch.Tensor) -> int:
    """A Fletcher-style checksum of a 1-D uint8 tensor, computed on its own device (no host copy of the payload).

    The bytes are read as int64 words in blocks of ``CHECKSUM_BLOCK``; arithmetic is modulo 2^64 (two's-complement
    wrap-around, the same on every device and in any reduction order). ``plain`` is the sum of every word and of
    the last ``n mod 8`` bytes, ``weighted`` the sum of each whole block's sum times its index + 1: a flipped bit
    changes ``plain`` by a power of two, a swap of two blocks changes ``weighted``, a zeroed or cut stretch both.
    The result is ``weighted << 64 | plain``. One pass over the bytes at the memory's speed (int64 sums need no
    widening), plus two scalars to the host. Not cryptographic: it guards against a transport's corruption and
    truncation, not against a forger.
    """
    n = payload.numel()
    if n == 0:
        return 0
    if payload.storage_offset() % 8:  # an int64 view needs an 8-byte aligned start
        payload = payload.clone()
    words = payload[: n - n % 8].view(torch.int64)
    whole = words.numel() - words.numel() % CHECKSUM_BLOCK
    blocks = words[:whole].view(-1, CHECKSUM_BLOCK).sum(dim=1)
    weights = torch.arange(1, blocks.numel() + 1, device=payload.device, dtype=torch.int64)
    plain = blocks.sum() + words[whole:].sum() + payload[n - n % 8:].sum(dtype=torch.int64)
    weighted = (blocks * weights).sum()
    sums = torch.stack([plain, weighted]).tolist()
    return ((int(sums[1]) & _MASK64) << 64) | (int(sums[0]) & _MASK64)


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, on its own device (a copy only if it is not contiguous)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def _entry(name: str, tensor: torch.Tensor, offset: int) -> TensorEntry:
    dtype = str(tensor.dtype).removeprefix("torch.")
    if dtype not in WIRE_DTYPES:
        raise SyncError(f"tensor {name}: dtype {dtype} cannot be sent (known: {sorted(WIRE_DTYPES)})")
    return TensorEntry(name, dtype, tuple(tensor.shape), offset, tensor.numel() * tensor.element_size())


def _bucket(version: int, sender: int, index: int, entries: list[TensorEntry], payload: torch.Tensor) -> PackedBucket:
    return PackedBucket(BucketHeader(version, sender, index, tuple(entries), payload.numel(),
                                     payload_checksum(payload)), payload)


def end_marker(version: int, sender: int, index: int) -> PackedBucket:
    return PackedBucket(BucketHeader(version, sender, index, (), 0, 0, end=True), torch.empty(0, dtype=torch.uint8))


def pack_buckets(named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int, version: int,
                 sender: int = 0, device: torch.device | str | None = None) -> Iterator[PackedBucket]:
    """Copy tensors, in order, into flat buckets of at most ``bucket_bytes`` (an oversize tensor travels alone,
    its bytes not copied unless it must change device), then the end marker. Holds one bucket buffer and the
    tensor being added. ``device``: where the buckets are built -- the transport's (``SyncGroup.device``: the GPU
    on NCCL, so a GPU trainer's tensors never touch the host; the host on gloo); default each tensor's own."""
    if bucket_bytes <= 0:
        raise SyncError(f"bucket size must be positive, got {bucket_bytes} bytes")
    index, used, entries = 0, 0, []
    buffer = None
    for name, tensor in named_tensors:
        data = _as_bytes(tensor)
        start = -(-used // ALIGN) * ALIGN  # every tensor starts aligned, so it is viewed in place on arrival
        if entries and start + data.numel() > bucket_bytes:
            yield _bucket(version, sender, index, entries, buffer[:used])
            index, start, used, entries, buffer = index + 1, 0, 0, [], None
        if data.numel() > bucket_bytes:
            alone = data if device is None else data.to(device)
            yield _bucket(version, sender, index, [_entry(name, tensor, 0)], alone)
            index, data, tensor, alone = index + 1, None, None, None  # let it go before the next tensor is made
            continue
        if buffer is None:
            buffer = torch.empty(bucket_bytes, dtype=torch.uint8, device=data.device if device is None else device)
        buffer[used:start].zero_()
        buffer[start: start + data.numel()].copy_(data)
        entries.append(_entry(name, tensor, start))
        used = start + data.numel()
    if entries:
        yield _bucket(version, sender, index, entries, buffer[:used])
        index += 1
    yield end_marker(version, sender, index)


def unpack(bucket: PackedBucket) -> list[tuple[str, torch.Tensor]]:
    """The bucket's tensors as views of its payload (copy them before the payload is reused)."""
    out = []
    for e in bucket.header.entries:
        dtype = WIRE_DTYPES.get(e.dtype)
        if dtype is None or e.offset < 0 or e.offset + e.nbytes > bucket.payload.numel():
            raise BucketError(f"weight sync v{bucket.header.version}: {bucket.label}: tensor {e.name} ({e.dtype}, "
                              f"bytes {e.offset}+{e.nbytes}) does not fit its {bucket.payload.numel()}-byte payload")
        out.append((e.name, bucket.payload[e.offset: e.offset + e.nbytes].view(dtype).reshape(e.shape)))
    return out


def verified_stream(buckets: Iterable[PackedBucket], version: int, senders: int
                    ) -> Iterator[tuple[str, list[tuple[str, torch.Tensor]]]]:
    """(label, tensors) of every bucket of ``senders`` senders, checked on arrival; the stream must hold each
    sender's buckets 0, 1, ... and its end marker, senders in order. Raises ``BucketError`` naming the bucket."""
    names: set[str] = set()
    stream = iter(buckets)
    for sender in range(senders):
        expected = 0
        while True:
            where = f"weight sync v{version}: bucket {expected} of sender {sender}"
            bucket = next(stream, None)
            if bucket is None:
                raise BucketError(f"{where}: the stream ended before it arrived")
            h = bucket.header
            if (h.version, h.sender, h.index) != (version, sender, expected):
                raise BucketError(f"{where}: got bucket {h.index} of sender {h.sender} of v{h.version} instead "
                                "(a bucket was lost or reordered)")
            if bucket.payload.numel() != h.nbytes or payload_checksum(bucket.payload) != h.checksum:
                raise BucketError(f"{where}: payload fails its checksum ({bucket.payload.numel()} of {h.nbytes} bytes)")
            if h.end:
                break
            tensors = unpack(bucket)
            for name, _ in tensors:
                if name in names:
                    raise BucketError(f"{where}: tensor {name} arrived twice")
                names.add(name)
            yield f"bucket {h.index} of sender {sender}", tensors
            expected += 1
    extra = next(stream, None)
    if extra is not None:
        raise BucketError(f"weight sync v{version}: {extra.label} arrived after every sender's end marker")
