"""Name-aware conversion of a stream of (name, tensor) pairs: the one function that both the checkpoint
converter (a shard at a time) and the weight sync after each RL update (a bucket at a time) call.

    for name, t in quantize_tensors(model.state_dict().items(), "e4m3fnuz"):
        ...  # FP8 weights followed by their `*_scale_inv`; everything else unchanged

Every quantised tensor is checked as it passes: NaN/Inf in, NaN out, or an error above the threshold
(default: the theoretical bound in repro.fp8.verify) raises CheckpointError naming the tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

import torch

from repro.errors import CheckpointError
from repro.fp8.quant import (
    BLOCK_SIZE,
    FP8Format,
    NonFiniteInputError,
    e4m3fn_to_e4m3fnuz,
    get_format,
    quantize_block_with_error,
)
from repro.fp8.mxfp4 import PACKED_FP4, double_scale
from repro.fp8.rules import Decision, decide, scale_name, scale_shape
from repro.fp8.verify import TensorStats, check_stats, rel_error_bound

HIGH_PRECISION = (torch.bfloat16, torch.float16, torch.float32)
INTEGER_TABLES = (torch.int32, torch.int64)

Rule = Callable[[str, tuple, torch.dtype], Decision]


def check_input_dtype(name: str, dtype: torch.dtype, decision: Decision, where: str = "") -> None:
    """A high-precision checkpoint holds bf16/fp16/fp32 tensors and integer tables; anything else is refused."""
    allowed = HIGH_PRECISION if decision.quantise else HIGH_PRECISION + INTEGER_TABLES + (torch.bool,)
    if dtype not in allowed:
        prefix = f"{where}: " if where else ""
        raise CheckpointError(
            f"{prefix}tensor {name}: unexpected dtype {str(dtype).removeprefix('torch.')} "
            f"(expected {'/'.join(str(d).removeprefix('torch.') for d in allowed)})"
        )


def planned_outputs(name: str, shape: tuple, dtype: torch.dtype, fmt: FP8Format, rule: Rule = decide,
                    block_size: int = BLOCK_SIZE, scale_namer: Callable[[str], str] = scale_name
                    ) -> list[tuple[str, torch.dtype, tuple]]:
    """What `quantize_tensors` yields for one input tensor, known from its metadata alone."""
    if rule(name, shape, dtype).quantise:
        return [(name, fmt.dtype, tuple(shape)), (scale_namer(name), torch.float32, scale_shape(shape, block_size))]
    return [(name, dtype, tuple(shape))]


def quantize_tensors(
    items: Iterable[tuple[str, torch.Tensor] | tuple[str, torch.Tensor, Callable[[int, int], None] | None]],
    fmt: str | FP8Format = "e4m3fn",
    *,
    pow2_scale: bool = False,
    block_size: int = BLOCK_SIZE,
    rule: Rule = decide,
    max_rel_error: float | None = None,
    on_stats: Callable[[TensorStats], None] | None = None,
    where: str = "",
    scale_namer: Callable[[str], str] = scale_name,
    threads: int = 1,
    overwrite_input: bool = False,
    on_ready: Callable[[str, torch.Tensor, int], None] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """BF16 (name, tensor) pairs in, checkpoint-ready pairs out.

    A tensor that `rule` quantises yields (name, fp8) then (`scale_namer(name)`, fp32 block scales: DeepSeek-V3's
    `_scale_inv` by default, `rules.release_scale_name` for the DeepSeek-V4 release's `.scale`); any other tensor
    is yielded unchanged. `on_stats` receives a TensorStats per input tensor (error figures for the FP8 ones).
    `where` (e.g. the shard path) prefixes error messages. `threads` > 1 quantises each tensor's slabs on that
    many threads (the same bytes). `overwrite_input`: each input tensor is scratch that is dead once its pairs are
    consumed (a read buffer, refilled only after the consumer has written them), so its FP8 bytes are written over
    its own memory (see `quantize_block_with_error`). `on_ready(name, flat, n)`: the first n elements of the FP8
    tensor about to be yielded as `name` are final (its `on_ready`), for a writer that streams them meanwhile.
    An item may carry a third element, `fill(a, b)`: the tensor's bytes are not read yet, and fill reads its
    bytes [a, b) into its memory; the quantiser's threads then read it slab by slab (kept tensors are read
    whole first).
    """
    fmt = get_format(fmt)
    limit = rel_error_bound(fmt, pow2_scale, block_size) if max_rel_error is None else max_rel_error
    prefix = f"{where}: " if where else ""
    for name, t, *rest in items:
        fill = rest[0] if rest else None
        shape = tuple(t.shape)
        decision = rule(name, shape, t.dtype)
        check_input_dtype(name, t.dtype, decision, where)
        stats = TensorStats(
            name=name, shape=shape, dtype=str(t.dtype).removeprefix("torch."),
            action="fp8" if decision.quantise else "keep", reason=decision.reason,
            numel=t.numel(), bytes_in=t.numel() * t.dtype.itemsize, bytes_out=t.numel() * t.dtype.itemsize,
        )
        if not decision.quantise:
            if fill is not None:
                fill(0, t.numel() * t.dtype.itemsize)
            if t.is_floating_point() and t.numel() and not _all_finite(t):
                raise CheckpointError(f"{prefix}tensor {name}: holds NaN or Inf")
            if on_stats:
                on_stats(stats)
            yield name, t
            continue
        try:
            ready = None if on_ready is None else lambda flat, n, name=name: on_ready(name, flat, n)
            q, s, err = quantize_block_with_error(t, fmt, block_size=block_size, pow2_scale=pow2_scale,
                                                  threads=threads, overwrite_input=overwrite_input, on_ready=ready,
                                                  fill=fill)
        except NonFiniteInputError:
            raise CheckpointError(f"{prefix}tensor {name}: holds NaN or Inf") from None
        stats.bytes_out = q.numel() + s.numel() * 4
        stats.rel_error, stats.max_abs_error, stats.max_abs = err.rel_error, err.max_abs_err, err.max_abs_ref
        check_stats(stats, limit, fmt, pow2_scale, fp8_nan=err.fp8_nan, where=where)
        if on_stats:
            on_stats(stats)
        yield name, q
        yield scale_namer(name), s


FP4_ON_GFX942 = (
    "holds MXFP4 (e2m1) routed experts: MI300/MI308X (gfx942) has no FP4 compute, and vLLM's MXFP4 MoE kernels "
    "on ROCm target gfx950 (MI350). Serve FP8 there instead: convert the BF16 release "
    "(RedHatAI/DeepSeek-V4-Flash-BF16) with `repro convert --format e4m3fnuz`"
)


def fn_to_fnuz_tensors(
    items: Iterable[tuple[str, torch.Tensor]],
    scales: Mapping[str, str],
    *,
    on_stats: Callable[[TensorStats], None] | None = None,
    where: str = "",
) -> Iterator[tuple[str, torch.Tensor]]:
    """An e4m3fn checkpoint's pairs -> e4m3fnuz, by vLLM's rule (`e4m3fn_to_e4m3fnuz`).

    `scales` (scale name -> weight name, from `rules.pair_scales` over the whole checkpoint) says which tensors
    are block scales, whatever their naming convention (`_scale_inv`, `.scale`, `.weight_scale`, `input_scale`):
    every one is doubled in its own dtype (an E8M0 scale gains one in its exponent byte), since fnuz bits mean
    half the fn value. Weights and scales are converted independently (they may sit in different shards): fp8
    weights get the -128 -> 0 fix and are reinterpreted, the rest passes. A scale of a packed FP4 weight is
    refused (`FP4_ON_GFX942`).
    """
    prefix = f"{where}: " if where else ""
    owners = set(scales.values())
    one = torch.ones(())
    for name, t in items:
        action, reason, dtype_in = "keep", "not FP8", str(t.dtype).removeprefix("torch.")
        if name in owners and t.dtype in PACKED_FP4:
            raise CheckpointError(f"{prefix}tensor {name} {FP4_ON_GFX942}")
        if t.dtype == torch.float8_e4m3fn:
            t, _, _ = e4m3fn_to_e4m3fnuz(t, one)
            action, reason = "fn->fnuz", "bit pattern -128 -> 0, reinterpreted as e4m3fnuz"
        elif name in scales:
            try:
                t = double_scale(t)
            except ValueError as err:
                raise CheckpointError(f"{prefix}tensor {name}: {err}") from None
            action, reason = "fn->fnuz", f"scale of {scales[name]} doubled (fnuz bits mean half the fn value)"
        if on_stats:
            n = t.numel() * t.dtype.itemsize
            on_stats(TensorStats(name=name, shape=tuple(t.shape), dtype=dtype_in,
                                 action=action, reason=reason, numel=t.numel(), bytes_in=n, bytes_out=n))
        yield name, t


def _all_finite(t: torch.Tensor) -> bool:
    # amax/amin propagate NaN and expose ±Inf, without a bool tensor the size of t
    flat = t.reshape(-1)
    return bool(torch.isfinite(flat.amax())) and bool(torch.isfinite(flat.amin()))
