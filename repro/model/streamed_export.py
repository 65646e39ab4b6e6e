"""A trainer state's weights as a release- or transformers-layout safetensors folder, streamed slab by slab.

    plan = plan_weights(trainer_dir, layout="deepseek", dtype=torch.bfloat16)     # headers only, no tensor data
    written = write_weights(plan, folder, max_shard_bytes=5 * 10**9)              # shards + index, one slab at a time

The source is a ``repro.train.trainer_state`` folder: ``master.safetensors`` (the fp32 masters of a bf16 trainer)
for every parameter, ``model.safetensors`` for what has no master (buffers: the hash router's ``tid2eid``, the
router's selection bias) and for every tensor of an fp32 trainer, whose parameters are their own masters.

Every output tensor is one contiguous run of one source tensor: the whole of it, or in the release layout one
routed expert's ``w1``/``w3`` rows or ``w2`` of a stacked ``gate_up_proj``/``down_proj``
(``repro.model.layouts.release_parts``, the one name mapping). So it is read with ``pread`` in slabs of at most
``SLAB_BYTES``, cast, checked finite and handed to ``StreamingWriter.write_pieces``: the process holds one slab,
its cast copy and the writer's staging buffers, whatever the size of the tensor or the model.

Dtypes: floating tensors in ``dtype``, except those the release keeps FP32 (``layouts.keeps_fp32``) of a
DeepSeek-V4, which stay FP32; integer tensors as stored. Casting the fp32 masters to BF16 rounds to nearest,
as the trainer's own ``master.to(bf16)`` after each update does, so a BF16 export holds the trainer's BF16 weights
bit for bit.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from repro.errors import CheckpointError
from repro.fp8.safetensors_io import StreamingWriter, TensorInfo, read_header, read_tensor
from repro.model import layouts
from repro.model.tiny_release import shard

SLAB_BYTES = 32 << 20  # source bytes read, cast and written at a time
MODEL_FILE, MASTER_FILE = "model.safetensors", "master.safetensors"
INDEX_FILE = "model.safetensors.index.json"


@dataclass(frozen=True)
class Planned:
    """One output tensor: ``name``, stored ``dtype`` and ``shape``, cut from ``source`` (a tensor of ``file``)
    starting ``start`` elements in."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    file: Path
    source: TensorInfo
    start: int = 0

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass(frozen=True)
class WrittenWeights:
    files: list[str]          # shard file names, in order
    tensors: int
    bytes: int
    by_dtype: dict[str, int]  # stored dtype -> tensors


def stored_dtype(name: str, source: torch.dtype, dtype: torch.dtype, v4: bool) -> torch.dtype:
    """Integers as stored; of a DeepSeek-V4, what the release keeps FP32 in FP32; every other float in ``dtype``."""
    if not source.is_floating_point:
        return source
    return torch.float32 if v4 and layouts.keeps_fp32(name) else dtype


def _headers(trainer_dir: Path, needs_master: bool) -> tuple[dict[str, tuple[Path, TensorInfo]], list[str]]:
    """name -> (file, header entry) of every weight the state holds (masters first), and the module's names in
    ``model.safetensors`` order."""
    model_file, master_file = trainer_dir / MODEL_FILE, trainer_dir / MASTER_FILE
    model, _ = read_header(model_file)
    names = [t.name for t in model]
    found = {t.name: (model_file, t) for t in model}
    if needs_master:
        if not master_file.is_file():
            raise CheckpointError(f"{master_file} is missing: a bf16 trainer's fp32 masters are what is exported")
        master, _ = read_header(master_file)
        stray = sorted({t.name for t in master} - set(found))
        if stray:
            raise CheckpointError(f"{master_file}: masters of tensors {MODEL_FILE} does not hold: {stray[:3]}")
        for t in master:
            held = found[t.name][1]
            if held.shape != t.shape:
                raise CheckpointError(f"{master_file}: {t.name} is {list(t.shape)}, "
                                      f"{MODEL_FILE} has {list(held.shape)}")
            found[t.name] = (master_file, t)
    return found, names


def plan_weights(trainer_dir: str | Path, layout: str, dtype: torch.dtype, *, v4: bool,
                 needs_master: bool) -> list[Planned]:
    """Every output tensor of ``trainer_dir``'s weights in ``layout`` (``layouts.DEEPSEEK`` or ``layouts.HF``), in
    the release's reading order (layer by layer), from the safetensors headers alone.

    ``v4``: the model is a DeepSeek-V4 (release names and FP32 rule apply); ``needs_master``: a bf16 trainer, whose
    ``master.safetensors`` must hold the fp32 master of every parameter."""
    if layout not in layouts.LAYOUTS:
        raise ValueError(f"layout must be one of {layouts.LAYOUTS}, got {layout!r}")
    if layout == layouts.DEEPSEEK and not v4:
        raise CheckpointError(f"{trainer_dir}: the release layout exists for DeepSeek-V4 only; export this model "
                              "with --layout hf")
    found, names = _headers(Path(trainer_dir), needs_master)
    planned = []
    for name in names:
        file, info = found[name]
        if layout == layouts.HF:
            planned.append(Planned(name, stored_dtype(name, info.dtype, dtype, v4), info.shape, file, info))
            continue
        for part in layouts.release_parts(name, info.shape):
            start = 0
            if part.expert is not None:
                start = part.expert * math.prod(info.shape[1:]) + (part.rows[0] * info.shape[2] if part.rows else 0)
            planned.append(Planned(part.name, stored_dtype(part.name, info.dtype, dtype, v4), part.shape, file, info,
                                   start))
    if not v4:
        return planned
    first_release = {p.name: (layouts.release_parts(p.name, p.shape)[0].name if layout == layouts.HF else p.name)
                     for p in planned}
    order = {name: i for i, name in enumerate(layouts.release_order(first_release.values()))}
    return sorted(planned, key=lambda p: order[first_release[p.name]])


def _slabs(planned: Planned, handle, buffer: torch.Tensor):
    """The tensor's elements in ``planned.dtype``, ``SLAB_BYTES`` of source at a time (views of ``buffer`` when no
    cast is needed), each checked finite."""
    itemsize = planned.source.dtype.itemsize
    per_slab = max(1, SLAB_BYTES // itemsize)
    for first in range(0, planned.numel, per_slab):
        count = min(per_slab, planned.numel - first)
        offset = planned.source.offset + (planned.start + first) * itemsize
        info = TensorInfo(planned.source.name, planned.source.dtype, (count,), offset, count * itemsize)
        slab = read_tensor(handle, info, planned.file, buffer).to(planned.dtype)
        if slab.is_floating_point() and not torch.isfinite(slab).all():
            raise CheckpointError(f"{planned.file}: {planned.source.name} holds NaN or Inf (exporting {planned.name}); "
                                  "this checkpoint's policy is broken, export an earlier step")
        yield slab


def write_weights(planned: list[Planned], folder: str | Path, max_shard_bytes: int | None) -> WrittenWeights:
    """Write ``planned`` into ``folder`` (an empty staging folder): ``model.safetensors``, or shards of at most
    ``max_shard_bytes`` (a bigger tensor gets a shard of its own) named as transformers names them, with
    ``model.safetensors.index.json``. Each shard is fsynced when finished."""
    folder = Path(folder)
    meta = {p.name: torch.empty(p.shape, dtype=p.dtype, device="meta") for p in planned}
    groups = [list(group) for group in shard(meta, max_shard_bytes)]
    by_name = {p.name: p for p in planned}
    files = ([MODEL_FILE] if len(groups) == 1
             else [f"model-{i:05d}-of-{len(groups):05d}.safetensors" for i in range(1, len(groups) + 1)])
    buffer = torch.empty(SLAB_BYTES + 8, dtype=torch.uint8)  # 8: a slab is at least one element of any dtype
    handles: dict[Path, object] = {}
    try:
        for file, names in zip(files, groups):
            writer = StreamingWriter(folder / file, [(n, by_name[n].dtype, by_name[n].shape) for n in names])
            try:
                for name in names:
                    p = by_name[name]
                    handle = handles.get(p.file) or handles.setdefault(p.file, open(p.file, "rb"))
                    writer.write_pieces(name, _slabs(p, handle, buffer))
                writer.close()
            finally:
                writer.abort()
    finally:
        for handle in handles.values():
            handle.close()
    total = sum(p.nbytes for p in planned)
    if len(groups) > 1:
        weight_map = {name: file for file, names in zip(files, groups) for name in names}
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    counts: dict[str, int] = {}
    for p in planned:
        key = str(p.dtype).removeprefix("torch.")
        counts[key] = counts.get(key, 0) + 1
    return WrittenWeights(files, len(planned), total, dict(sorted(counts.items())))
