"""Minimal safetensors reader and streaming writer, so a shard is read one tensor at a time and written as
it is converted, without mmap (mmap'd pages count in RSS) and with errors that name the file and tensor.

Format (https://github.com/huggingface/safetensors): 8-byte little-endian header length n, n bytes of JSON
`{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}` (offsets relative to the byte
after the header), then the tensor bytes, contiguous and in offset order. Files written here load with the
`safetensors` library (tests check it).
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import mmap
import os
import queue
import struct
import threading
import traceback
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from repro.errors import CheckpointError

DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz,
    "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
    "F8_E8M0": torch.float8_e8m0fnu,  # power-of-two block scales (the official DeepSeek-V4 release's `.scale`)
    "F4": torch.float4_e2m1fn_x2,  # MXFP4 e2m1, two values a byte (the official release's routed experts)
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
# F4's header shape counts e2m1 values; torch holds two per byte, so its last dimension is half the header's.
_PACKED = {torch.float4_e2m1fn_x2: 2}
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors library's own limit


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # absolute position of the first byte in the file
    nbytes: int


def read_header(path: str | Path) -> tuple[list[TensorInfo], dict]:
    """Tensors of a .safetensors file in file order, and its __metadata__. Raises CheckpointError naming the
    file (and tensor) for a missing, truncated or corrupt file."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, no header length)")
            (n,) = struct.unpack("<Q", head)
            if n > min(_MAX_HEADER, size - 8):
                raise CheckpointError(
                    f"{path}: corrupt or truncated safetensors file (header length {n} > {size - 8} bytes left)"
                )
            raw = f.read(n)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("not a JSON object")
    except (UnicodeDecodeError, ValueError) as err:
        raise CheckpointError(f"{path}: corrupt safetensors header ({err})") from None
    metadata = header.pop("__metadata__", None) or {}
    base = 8 + n
    infos = []
    for name, entry in header.items():
        try:
            kind = entry["dtype"]
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(o) for o in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(f"{path}: tensor {name}: corrupt header entry {entry!r} ({err!r})") from None
        if kind not in DTYPES:
            raise CheckpointError(f"{path}: tensor {name}: dtype {kind!r} is not one this reader knows "
                                  f"({', '.join(DTYPES)})")
        dtype = DTYPES[kind]
        shape = _torch_shape(shape, dtype, f"{path}: tensor {name}")
        nbytes = math.prod(shape) * dtype.itemsize
        if end - begin != nbytes or begin < 0 or any(d < 0 for d in shape):
            raise CheckpointError(
                f"{path}: tensor {name}: corrupt header, offsets {begin}..{end} do not hold "
                f"{entry['dtype']}{list(shape)} ({nbytes} bytes)"
            )
        infos.append(TensorInfo(name, dtype, shape, base + begin, nbytes))
    infos.sort(key=lambda t: t.offset)
    expected = base
    for t in infos:
        if t.offset != expected:
            raise CheckpointError(f"{path}: tensor {t.name}: corrupt header, data not contiguous at byte {t.offset}")
        expected += t.nbytes
    if expected != size:
        what = "truncated" if expected > size else "corrupt (trailing bytes)"
        last = infos[-1].name if infos else "-"
        raise CheckpointError(f"{path}: {what} safetensors file: header needs {expected} bytes "
                              f"(last tensor {last}), file has {size}")
    return infos, metadata


def _torch_shape(shape: tuple[int, ...], dtype: torch.dtype, where: str) -> tuple[int, ...]:
    """A header shape as torch holds it: packed dtypes fold their last dimension."""
    per_byte = _PACKED.get(dtype, 1)
    if per_byte == 1:
        return shape
    if not shape or shape[-1] % per_byte:
        raise CheckpointError(f"{where}: {DTYPE_NAMES[dtype]} shape {list(shape)} has a last dimension that is "
                              f"not a multiple of {per_byte} (values per byte)")
    return (*shape[:-1], shape[-1] // per_byte)


def header_shape(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[int, ...]:
    """The shape safetensors writes for a torch tensor of ``shape`` and ``dtype`` (packed: values, not bytes)."""
    per_byte = _PACKED.get(dtype, 1)
    return shape if per_byte == 1 else (*shape[:-1], shape[-1] * per_byte)


def read_tensor(f, info: TensorInfo, path: str | Path = "", buffer: torch.Tensor | None = None) -> torch.Tensor:
    """Read one tensor from an open binary file, into fresh memory or into `buffer` (uint8, large enough;
    the result is then a view of it, valid until the buffer is reused)."""
    tensor, fill = tensor_filler(f.fileno(), info, path, torch.empty(info.nbytes, dtype=torch.uint8)
                                 if buffer is None else buffer)
    fill(0, info.nbytes)
    return tensor


def tensor_filler(fd: int, info: TensorInfo, path: str | Path, buffer: torch.Tensor
                  ) -> tuple[torch.Tensor, Callable[[int, int], None]]:
    """A tensor's place in `buffer` (uint8, large enough) before it is read, and `fill(a, b)`, which reads its
    bytes [a, b) there from the open file `fd` with pread (no shared file position: threads may fill
    different ranges at once, and the GIL is released while each reads)."""
    raw = buffer[: info.nbytes]
    view = memoryview(raw.numpy())

    def fill(a: int, b: int) -> None:
        while a < b:
            got = os.preadv(fd, [view[a:b]], info.offset + a)
            if got <= 0:
                raise CheckpointError(f"{path}: tensor {info.name}: truncated while reading "
                                      f"({a} of {info.nbytes} bytes)")
            a += got

    return raw.view(info.dtype).reshape(info.shape), fill


class StreamingWriter:
    """Writes a .safetensors file whose header (names, dtypes, shapes) is known before the data.

    `write(name, tensor)` must be called in the planned order; a CRC-32 of the file is computed as it is
    written (it guards resumed shards against damage). `stream` writes a tensor's finished front ahead of it.

    The bytes go through a page-aligned staging buffer of `STAGE_BYTES` (so the caller may reuse a tensor's
    memory as soon as `write` returns). With `direct` (the default) the file is opened with O_DIRECT, so a full
    buffer is DMA'd to the device: writing through the page cache instead costs a kernel copy per byte, 0.3 to
    3.7 CPU-seconds per 1.3 GB on this VM depending on whether the page cache has to take fresh pages, against
    0.05 s with O_DIRECT. A file system that refuses O_DIRECT gets ordinary writes from the same buffer.
    There are `STAGES` staging buffers: the caller CRCs and copies into one while a writer thread writes the
    others (an O_DIRECT write waits for the device, ~1 s per GB here: time the caller spends quantising). An
    error of the writer thread is raised by the caller's next call.
    """

    def __init__(self, path: str | Path, plan: list[tuple[str, torch.dtype, tuple[int, ...]]],
                 metadata: dict | None = None, direct: bool = True):
        self.path = Path(path)
        self._plan = plan
        self._next = 0
        header: dict = {"__metadata__": {"format": "pt", **(metadata or {})}}
        offset = 0
        for name, dtype, shape in plan:
            nbytes = math.prod(shape) * dtype.itemsize
            header[name] = {"dtype": DTYPE_NAMES[dtype], "shape": list(header_shape(tuple(shape), dtype)),
                            "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self._fd, self.direct = _open_for_writing(self.path, direct)
        self._stages = [mmap.mmap(-1, STAGE_BYTES) for _ in range(STAGES)]  # page-aligned, as O_DIRECT needs
        self._free: queue.SimpleQueue = queue.SimpleQueue()  # stage indices the caller may fill
        self._full: queue.SimpleQueue = queue.SimpleQueue()  # (stage index, bytes) for the writer thread; None: stop
        for index in range(1, STAGES):
            self._free.put(index)
        self._stage, self._index, self._fill = self._stages[0], 0, 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._write_loop, name=f"write {self.path.name}", daemon=True)
        self._thread.start()
        self._streamed = 0  # bytes of the next planned tensor already written by `stream`
        self.crc32 = 0
        self._put(memoryview(struct.pack("<Q", len(raw)) + raw))
        self.size = 8 + len(raw) + offset

    def _put(self, data: memoryview) -> None:
        """CRC `data` and copy it into the staging buffer, handing that to the writer thread each time it is full
        (the CRC is taken here, not in the writer thread, which then only waits for the device)."""
        self.crc32 = zlib.crc32(data, self.crc32)
        done = 0
        while done < len(data):
            n = min(len(data) - done, STAGE_BYTES - self._fill)
            self._stage[self._fill : self._fill + n] = data[done : done + n]
            self._fill += n
            done += n
            if self._fill == STAGE_BYTES:
                self._hand_over()

    def _hand_over(self) -> None:
        if self._error is not None:
            raise self._error
        self._full.put((self._index, self._fill))
        self._index = self._free.get()  # waits while the writer thread holds every other buffer
        self._stage, self._fill = self._stages[self._index], 0
        if self._error is not None:
            raise self._error

    def _write_loop(self) -> None:
        while (job := self._full.get()) is not None:
            index, nbytes = job
            if self._error is None:
                try:
                    self._write_out(self._stages[index], nbytes)
                except BaseException as err:  # raised by the caller's next call; keep freeing buffers
                    traceback.clear_frames(err.__traceback__)  # their locals hold views of the staging buffer
                    self._error = err
            self._free.put(index)

    def _write_out(self, stage: mmap.mmap, nbytes: int) -> None:
        view, pos = memoryview(stage), 0
        try:
            while pos < nbytes:
                end = nbytes
                if self.direct:  # whole blocks only: the file's tail, or a short write, goes through the page cache
                    end = pos + (nbytes - pos) // _DIRECT_ALIGN * _DIRECT_ALIGN
                    if pos % _DIRECT_ALIGN or end == pos:
                        self._buffered()
                        continue
                try:
                    pos += os.write(self._fd, view[pos:end])
                except OSError as err:  # a file system that opened with O_DIRECT but refuses the write itself
                    if err.errno != errno.EINVAL or not self.direct:
                        raise
                    self._buffered()
        finally:
            view.release()

    def _buffered(self) -> None:
        if self.direct:
            fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~os.O_DIRECT)
            self.direct = False

    def write(self, name: str, tensor: torch.Tensor) -> None:
        if self._next >= len(self._plan):
            raise RuntimeError(f"{self.path}: unexpected extra tensor {name}")
        want = self._plan[self._next]
        got = (name, tensor.dtype, tuple(tensor.shape))
        if got != want:
            raise RuntimeError(f"{self.path}: tensor out of plan: got {got}, expected {want}")
        self._next += 1
        done, self._streamed = self._streamed, 0
        if tensor.numel():
            raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
            self._put(memoryview(raw[done:].numpy()))

    def write_pieces(self, name: str, pieces: Iterable[torch.Tensor]) -> None:
        """Write the next planned tensor from ``pieces``: consecutive runs of its row-major elements in its dtype,
        whose sizes add up to the tensor's. A producer then holds one slab at a time, never the whole tensor (the
        checkpoint export reads, converts and writes a stacked-expert tensor this way); each piece is copied out
        before the next is asked for, so a piece may live in a buffer the producer reuses."""
        want = self._plan[self._next] if self._next < len(self._plan) else None
        if want is None or want[0] != name or self._streamed:
            raise RuntimeError(f"{self.path}: tensor {name} out of plan, expected {want}")
        _, dtype, shape = want
        total, done = math.prod(shape) * dtype.itemsize, 0
        for piece in pieces:
            if piece.dtype != dtype:
                raise RuntimeError(f"{self.path}: tensor {name}: a piece is {piece.dtype}, the plan says {dtype}")
            raw = piece.detach().contiguous().reshape(-1).view(torch.uint8)
            if done + raw.numel() > total:
                raise RuntimeError(f"{self.path}: tensor {name}: pieces overrun its {total} bytes")
            self._put(memoryview(raw.numpy()))
            done += raw.numel()
        if done != total:
            raise RuntimeError(f"{self.path}: tensor {name}: pieces held {done} of its {total} bytes")
        self._next += 1

    def stream(self, name: str, flat: torch.Tensor, ready: int) -> None:
        """Write the first `ready` elements of the next planned tensor (`flat`: its 1-D contiguous memory) ahead
        of `write(name, tensor)`, which then writes only the rest; for a producer that finishes a tensor front
        to back (`repro.fp8.quant.quantize_block_with_error`'s `on_ready`)."""
        want = self._plan[self._next] if self._next < len(self._plan) else None
        if want is None or (name, flat.dtype, flat.numel()) != (want[0], want[1], math.prod(want[2])):
            raise RuntimeError(f"{self.path}: streamed tensor out of plan: got {(name, flat.dtype, flat.numel())}, "
                               f"expected {want}")
        end = ready * flat.dtype.itemsize
        if end > self._streamed:
            self._put(memoryview(flat.view(torch.uint8)[self._streamed : end].numpy()))
            self._streamed = end

    def close(self, fsync: bool = True) -> str:
        """Finish the file; returns its CRC-32 as 8 hex digits."""
        if self._next != len(self._plan):
            raise RuntimeError(f"{self.path}: only {self._next} of {len(self._plan)} tensors written")
        try:
            if self._fill:
                self._hand_over()
            self._stop_writing()
            if self._error is not None:
                raise self._error
            if fsync:
                os.fsync(self._fd)
        finally:
            self.abort()
        return f"{self.crc32:08x}"

    def _stop_writing(self) -> None:
        if self._thread.is_alive():
            self._full.put(None)
            self._thread.join()

    def abort(self) -> None:
        """Close the file (a no-op after close); what the writer thread holds is written first, or dropped."""
        self._stop_writing()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            for stage in self._stages:
                stage.close()


STAGES = 8  # staging buffers: one the caller fills, the others queued for or held by the writer thread
STAGE_BYTES = 1 << 20  # the writer's staging buffer, a multiple of any block size (4 MiB gained nothing)
_DIRECT_ALIGN = 4096  # O_DIRECT offsets and lengths: whole logical blocks (512 or 4096 bytes)


def _open_for_writing(path: Path, direct: bool) -> tuple[int, bool]:
    """A new file opened for writing, with O_DIRECT where asked for and the file system takes it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    if direct and hasattr(os, "O_DIRECT"):
        try:
            return os.open(path, flags | os.O_DIRECT, 0o666), True
        except OSError as err:
            if err.errno != errno.EINVAL:
                raise
    return os.open(path, flags, 0o666), False



def file_crc32(path: str | Path, chunk: int = 16 << 20) -> str:
    """CRC-32 of a file as 8 hex digits (what StreamingWriter.close returns)."""
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            crc = zlib.crc32(block, crc)
    return f"{crc:08x}"
