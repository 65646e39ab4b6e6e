"""Block-wise FP8 quantisation as pure tensor functions (no names, no files).

A weight W [N, K] is cut into 128×128 blocks. Each block b gets one fp32 scale s_b = amax_b / FP8_MAX, and
its elements are stored as q = fp8(W / s_b). Reading back: W ≈ q.float() × s_b. The scale tensor is called
`weight_scale_inv` in DeepSeek-V3 checkpoints (it is what the FP8 value is multiplied by), shape
[ceil(N/128), ceil(K/128)]; blocks at the right and bottom edges of a shape that is not a multiple of 128
are simply smaller.

Formats (`FORMATS`): `e4m3fn` (max 448; NVIDIA, MI350-class) and `e4m3fnuz` (max 240; MI300/MI308X,
gfx942). Both have 4 exponent bits and 3 mantissa bits; fnuz has exponent bias 8 instead of 7, no -0
and a single NaN (bit pattern 0x80), and a cast of an out-of-range value gives NaN, so values are clamped to
±max before the cast. `e4m3fn_to_e4m3fnuz` is vLLM's rule for loading an fn checkpoint on ROCm.

The quantiser is vectorised: per slab of block-rows, one bf16->fp32 copy, |x|, one amax over the block
dimensions of a [rows/128, 128, K/128, 128] view, one multiply by 1/s, one cast. On CPU the slab is a few
block-rows (sized to stay in cache, which is ~10x faster than whole-tensor temporaries), and `threads` > 1
spreads the slabs of one tensor over Python threads (torch releases the GIL inside each op; every thread has
its own scratch buffers, and the per-slab error sums are added in slab order, so the result does not depend
on the thread count); elsewhere the slab is the whole matrix. The optional error pass dequantises with
integer bit operations (exact; see `fp8_to_float`) because torch's fp8->fp32 cast is scalar on CPU.
A BF16 slab on CPU instead goes to one compiled call (`repro.fp8.fused`: the same bytes, ~2.5x less CPU, the
GIL released), which always computes the error figures; these torch ops remain the reference and the path for
fp16/fp32 inputs, other devices, and machines without a C compiler.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext as _nullcontext
from dataclasses import dataclass

import torch

from repro.fp8 import fused

MANTISSA_BITS = 3
BLOCK_SIZE = 128


@dataclass(frozen=True)
class FP8Format:
    name: str
    dtype: torch.dtype
    max: float  # largest finite value
    exponent_bias: int

    @property
    def min_normal(self) -> float:
        return 2.0 ** (1 - self.exponent_bias)

    @property
    def subnormal_step(self) -> float:
        """Spacing of the subnormal values (and of the lowest binade): min_normal / 2**mantissa_bits."""
        return self.min_normal / 2**MANTISSA_BITS


E4M3FN = FP8Format("e4m3fn", torch.float8_e4m3fn, 448.0, 7)
E4M3FNUZ = FP8Format("e4m3fnuz", torch.float8_e4m3fnuz, 240.0, 8)
FORMATS: dict[str, FP8Format] = {f.name: f for f in (E4M3FN, E4M3FNUZ)}


def get_format(fmt: str | FP8Format | torch.dtype) -> FP8Format:
    if isinstance(fmt, FP8Format):
        return fmt
    for f in FORMATS.values():
        if fmt in (f.name, f.dtype, str(f.dtype).removeprefix("torch."), "float8_" + f.name):
            return f
    raise ValueError(f"unknown FP8 format {fmt!r}; expected one of {sorted(FORMATS)}")


# Scales are at least the smallest normal fp32, so 1/scale stays finite for an all-zero block (which
# then quantises to zeros) and for blocks of denormal-sized values.
_MIN_SCALE = 2.0**-126
# CPU slab size in elements: big enough to amortise the ~5 us per-op overhead of eager torch, small enough
# for the five scratch buffers to stay in cache.
_CPU_SLAB_ELEMS = 1 << 19
# The compiled pass keeps no slab-sized scratch, so its slabs can be larger (fewer thread hand-offs).
_FUSED_SLAB_FACTOR = 4
_USE_FUSED = True  # False: the torch ops everywhere (tests compare the two paths)


@dataclass
class ErrorSums:
    """Running error of dequant(FP8) against the input, accumulated over slabs (and tensors)."""

    numel: int = 0
    sum_sq_ref: float = 0.0  # Σ w²
    sum_sq_err: float = 0.0  # Σ (deq - w)²
    max_abs_err: float = 0.0
    max_abs_ref: float = 0.0
    fp8_nan: int = 0  # slabs whose FP8 output held a NaN bit pattern

    @property
    def rel_error(self) -> float:
        """||deq - w||_F / ||w||_F (0 for an all-zero tensor)."""
        return math.sqrt(self.sum_sq_err / self.sum_sq_ref) if self.sum_sq_ref > 0 else math.sqrt(self.sum_sq_err)


class NonFiniteInputError(ValueError):
    """The tensor to quantise holds NaN or ±Inf."""


def quantize_block(
    w: torch.Tensor, fmt: str | FP8Format = "e4m3fn", *, block_size: int = BLOCK_SIZE, pow2_scale: bool = False,
    threads: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., N, K] (bf16/fp16/fp32) -> (q [..., N, K] fp8, scale_inv [..., ceil(N/b), ceil(K/b)] fp32).

    Dequantise with `dequantize_block(q, scale_inv)` = q.float() × scale per block. `pow2_scale` rounds each
    scale UP to a power of two (UE8M0, as DeepSeek's own V4 checkpoints store them), so no value overflows
    and 1/scale is exact. `threads` > 1 quantises the CPU slabs on that many threads (same bytes). Raises
    NonFiniteInputError if w holds NaN or Inf.
    """
    q, s, _ = _quantize(w, get_format(fmt), block_size, pow2_scale, with_error=False, threads=threads)
    return q, s


def quantize_block_with_error(
    w: torch.Tensor, fmt: str | FP8Format = "e4m3fn", *, block_size: int = BLOCK_SIZE, pow2_scale: bool = False,
    threads: int = 1, overwrite_input: bool = False, on_ready: Callable[[torch.Tensor, int], None] | None = None,
    fill: Callable[[int, int], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, ErrorSums]:
    """`quantize_block` plus the error of dequant(q) against w, computed in the same pass over the data.

    `overwrite_input`: w is scratch (a converter's read buffer), so on CPU the FP8 bytes are written over the
    front of w's own memory, each slab's only once the slabs whose input it covers have been read; q is then a
    view of w's storage and w is garbage. This saves allocating q (the converter's largest tensor after its read
    buffer). Falls back to a fresh q when w is not contiguous.

    `on_ready(q, n)`, called in the calling thread as slabs finish: the first n elements of q (in memory order)
    are final, so a writer can stream them while the rest is quantised (only for slabs of whole rows, as on
    CPU in place; n only grows, and the last call has n = q.numel()). A tensor that turns out to hold NaN/Inf
    raises afterwards, so what was streamed must then be thrown away.

    `fill(a, b)`: w's memory is not read yet; each slab thread calls fill for its bytes [a, b) of w (a CPU
    contiguous buffer) before quantising them, so reading the input is spread over the threads too."""
    return _quantize(w, get_format(fmt), block_size, pow2_scale, with_error=True, threads=threads,
                     overwrite_input=overwrite_input, on_ready=on_ready, fill=fill)


def dequantize_block(
    q: torch.Tensor, scale_inv: torch.Tensor, *, block_size: int = BLOCK_SIZE, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Reference dequantisation: q.float() × (scale_inv expanded to 128×128 blocks, edges cropped)."""
    *_, n, k = q.shape
    s = scale_inv.to(torch.float32)
    s = s.repeat_interleave(block_size, dim=-2)[..., :n, :].repeat_interleave(block_size, dim=-1)[..., :k]
    return (q.to(torch.float32) * s).to(dtype)


def fp8_to_float(q: torch.Tensor) -> torch.Tensor:
    """Exact fp8 (e4m3fn or e4m3fnuz) -> fp32 by bit placement; NaN patterns come out as finite values.

    The 7 exponent+mantissa bits shifted left by 20 land in the top of fp32's exponent and mantissa fields,
    which makes an fp32 of value |q| × 2^(bias - 127), subnormals included; multiplying by 2^(127 - bias)
    restores |q|, and the sign bit moves from bit 7 to bit 31. Tested equal to torch's cast on all 256
    patterns; several times faster than the cast on CPU.
    """
    fmt = get_format(q.dtype)
    u = q.view(torch.uint8).to(torch.int32)
    bits = ((u & 0x7F) << 20) | ((u & 0x80) << 24)
    return bits.view(torch.float32) * 2.0 ** (127 - fmt.exponent_bias)


def e4m3fn_to_e4m3fnuz(
    weight: torch.Tensor, weight_scale: torch.Tensor, input_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """vLLM's `normalize_e4m3fn_to_e4m3fnuz` (quantization/utils/w8a8_utils.py), out of place.

    The int8 bit pattern -128 (0x80) is -0 in e4m3fn but NaN in e4m3fnuz, so it becomes 0; every other byte
    is kept and reinterpreted as e4m3fnuz, where the same bits mean half the value (bias 8 instead of 7),
    so the scales are doubled: dequant(fnuz bits) × 2s = dequant(fn bits) × s exactly.
    (fn's NaN patterns 0x7F/0xFF become ±240 under this rule, as in vLLM; a valid weight never holds NaN.)
    """
    if weight.dtype != torch.float8_e4m3fn:
        raise TypeError(f"expected a float8_e4m3fn weight, got {weight.dtype}")
    as_int8 = weight.view(torch.int8).clone()
    as_int8[as_int8 == -128] = 0
    return (
        as_int8.view(torch.float8_e4m3fnuz),
        weight_scale * 2.0,
        None if input_scale is None else input_scale * 2.0,
    )


def _quantize(
    w: torch.Tensor, fmt: FP8Format, block: int, pow2: bool, with_error: bool, threads: int = 1,
    overwrite_input: bool = False, on_ready: Callable[[torch.Tensor, int], None] | None = None,
    fill: Callable[[int, int], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, ErrorSums | None]:
    if w.ndim < 2:
        raise ValueError(f"block quantisation needs a [..., N, K] tensor, got shape {tuple(w.shape)}")
    if w.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"expected a bf16/fp16/fp32 tensor, got {w.dtype}")
    *lead, n, k = w.shape
    if fill is not None and not (w.is_contiguous() and w.device.type == "cpu"):
        raise ValueError("fill: w must be contiguous CPU memory (the buffer it reads into)")
    w3 = w.reshape(-1, n, k).contiguous()
    in_place = overwrite_input and w.device.type == "cpu" and w.is_contiguous() and w.numel() > 0
    if in_place:  # the front numel bytes of w's memory, in w's element order
        q = w3.view(torch.uint8).reshape(-1)[: w3.numel()].view(fmt.dtype).view(w3.shape)
    else:
        q = torch.empty(w3.shape, dtype=fmt.dtype, device=w.device)
    scale = torch.empty((w3.shape[0], -(-n // block), -(-k // block)), dtype=torch.float32, device=w.device)
    # BF16 on CPU: one compiled pass per slab (repro.fp8.fused), with the error figures whether asked or not
    one_pass = _USE_FUSED and w.device.type == "cpu" and w.dtype == torch.bfloat16 and fused.kernel() is not None
    if w.device.type == "cpu":  # slabs of whole blocks: block-rows x a run of block-columns, ~_CPU_SLAB_ELEMS
        # whole rows when writing in place or reading by slab, so that each slab is one run of memory
        elems = _CPU_SLAB_ELEMS * (_FUSED_SLAB_FACTOR if one_pass else 1)
        slab_cols = k if in_place or fill is not None else min(k, block * max(1, elems // (block * block)))
        slab_rows = block * max(1, elems // (block * max(slab_cols, 1)))
    else:
        slab_rows, slab_cols = max(n, 1), max(k, 1)
    full = n // block * block
    rows = [(r, min(r + slab_rows, full)) for r in range(0, full, slab_rows)]
    if full < n:
        rows.append((full, n))  # the one partial block-row at the bottom edge
    cols = [(c, min(c + slab_cols, k)) for c in range(0, k, slab_cols)]
    slabs = [(e, r0, r1, c0, c1) for e in range(w3.shape[0]) for r0, r1 in rows for c0, c1 in cols]
    workspaces = threading.local()
    # In place, slab i's bytes [a_i, b_i) cover the input of every slab j <= i whose input bytes start below
    # b_i; slabs are started in order, so waiting for those to have read their input cannot deadlock.
    read = [threading.Event() for _ in slabs] if in_place else None
    start = [(e * n + r0) * k for e, r0, _, _, _ in slabs]

    def one_slab(i: int) -> torch.Tensor:
        e, r0, r1, c0, c1 = slabs[i]
        x, out = w3[e, r0:r1, c0:c1], q[e, r0:r1, c0:c1]
        s = scale[e, r0 // block : -(-r1 // block), c0 // block : -(-c1 // block)]
        end = start[i] + (r1 - r0) * k
        covered = [read[j] for j in range(i) if start[j] * w.dtype.itemsize < end] if read is not None else []
        try:
            if fill is not None:  # this slab's input is read here, by this thread (whole rows: one run of bytes)
                fill(start[i] * w.dtype.itemsize, end * w.dtype.itemsize)
            if one_pass:  # the kernel reads and writes row by row: wait for every covered slab first
                for event in covered:
                    event.wait()
                return _fused_slab(x, out, s, fmt, block, pow2)
            work = getattr(workspaces, "work", None)
            if work is None:
                work = workspaces.work = _Workspace(min(slab_rows, n) * slab_cols, w.device)
            hooks = (read[i].set, lambda: [event.wait() for event in covered]) if read is not None else None
            return _quantize_slab(x, out, s, fmt, block, pow2, with_error, work, hooks)
        finally:
            if read is not None:
                read[i].set()  # also on an error, so that no other slab waits forever

    threads = max(1, min(threads, len(slabs)))
    flat = q.reshape(-1)
    # slab i ends at element `ends[i]` of q's memory when slabs are whole rows, in order (else report only the end)
    ends = [start[i] + (r1 - r0) * k for i, (_, r0, r1, _, _) in enumerate(slabs)] if slab_cols == k else None
    figures = []
    with ThreadPoolExecutor(threads, thread_name_prefix="fp8-slab") if threads > 1 else _nullcontext() as pool:
        for i, figure in enumerate(pool.map(one_slab, range(len(slabs))) if pool else map(one_slab, range(len(slabs)))):
            figures.append(figure)  # map yields in slab order: slabs 0..i are done
            if on_ready is not None and ends is not None:
                on_ready(flat, ends[i])
    if on_ready is not None and (ends is None or not slabs):
        on_ready(flat, flat.numel())
    figures = torch.stack(figures) if figures else torch.zeros((0, 6 if with_error else 1))
    # the last figure of a slab is its largest |w|, NaN or Inf if any element is: one check per tensor
    if not bool(torch.isfinite(figures[:, -1]).all()):
        raise NonFiniteInputError("holds NaN or Inf")
    err = _error_sums(figures, fmt, w.numel()) if with_error else None
    return q.reshape(w.shape), scale.reshape(*lead, *scale.shape[1:]), err


class _Workspace:
    """Scratch buffers reused by every slab one thread quantises (one set per thread): the fp32 input, |input|,
    a 4-byte buffer for the scaled values (then the dequantised ones, via their bits) and a byte buffer."""

    def __init__(self, numel: int, device: torch.device):
        self.f = torch.empty(numel, dtype=torch.float32, device=device)
        self.a = torch.empty(numel, dtype=torch.float32, device=device)
        self.y = torch.empty(numel, dtype=torch.float32, device=device)
        self.b = torch.empty(numel, dtype=torch.uint8, device=device)


def _ceil_pow2(scale: torch.Tensor) -> torch.Tensor:
    """Smallest power of two >= scale (exact, via frexp: scale = m·2^e with m in [0.5, 1))."""
    mantissa, exponent = torch.frexp(scale)
    exponent = exponent - (mantissa == 0.5).to(exponent.dtype)
    return torch.ldexp(torch.ones_like(scale), exponent)


def _quantize_slab(x, q, s, fmt: FP8Format, block: int, pow2: bool, with_error: bool, work: _Workspace,
                   hooks=None):
    """x [rows, cols] -> q [rows, cols], s [gb, nbk] (views into the tensor's outputs). rows is a multiple of
    `block` or the one partial block-row; cols is a multiple of `block` except in the last column slab.
    Returns the slab's error figures (see `_slab_error`) when `with_error`, else [max |x|]; nothing is checked
    here, so a slab never waits for a conversion to Python (the caller checks that max |x| is finite).
    hooks: (called once x is read, called before q is written), for q written over the input."""
    rows, k = x.shape
    gb = s.shape[0]
    rb = rows // gb
    kf = k // block * block
    nbf, tail = kf // block, k - kf

    def split(t):
        """Views of a [rows, K] buffer: full column blocks [gb, rb, nbf, block] and the edge [gb, rb, tail]."""
        return t[:, :kf].view(gb, rb, nbf, block), t[:, kf:].view(gb, rb, tail)

    n = rows * k
    f, a, y = (buf[:n].view(rows, k) for buf in (work.f, work.a, work.y))
    f.copy_(x)  # fp32 copy of the input
    if hooks:
        hooks[0]()
    torch.abs(f, out=a)
    a_main, a_tail = split(a)
    amax = torch.empty((gb, s.shape[1]), dtype=torch.float32, device=x.device)
    if nbf:  # innermost (contiguous) dimension first: ~25% faster than one amax over dims (1, 3)
        amax[:, :nbf] = a_main.amax(dim=3).amax(dim=1)
    if tail:
        amax[:, nbf] = a_tail.amax(dim=2).amax(dim=1)
    scale = (amax / fmt.max).clamp_(min=_MIN_SCALE)
    if pow2:
        scale = _ceil_pow2(scale)
    s.copy_(scale)
    inv = scale.reciprocal()
    (f_main, f_tail), (y_main, y_tail) = split(f), split(y)
    if nbf:
        torch.mul(f_main, inv[:, None, :nbf, None], out=y_main)
    if tail:
        torch.mul(f_tail, inv[:, nbf:, None], out=y_tail)
    # No clamp to ±max: |y| <= amax / (amax / max) exceeds max by a few ulps at most, and torch's cast rounds
    # everything below the midpoint to the next (absent) binade down to ±max, in both formats (tested).
    if hooks:
        hooks[1]()
    q.copy_(y)
    amax_max = amax.max().reshape(1) if amax.numel() else amax.new_zeros(1)
    if with_error:
        return _slab_error(f, a, q, scale, amax_max, fmt, split, y, work.b[:n].view(rows, k))
    return amax_max


def _fused_slab(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, fmt: FP8Format, block: int, pow2: bool
                ) -> torch.Tensor:
    """`_quantize_slab` for a BF16 slab, by the compiled kernel (`repro.fp8.fused`; GIL released)."""
    return fused.quantize_bf16(x.detach(), q.view(torch.uint8), s, block, fmt.max, _MIN_SCALE, pow2,
                               fmt.name == "e4m3fnuz", 2.0 ** (127 - fmt.exponent_bias),
                               0x7F if fmt.name == "e4m3fn" else -128)


def _error_sums(per_slab: torch.Tensor, fmt: FP8Format, numel: int) -> ErrorSums:
    """Add up the slabs' [||d||, ||w||, max(-d), max(d), NaN probe, max|w|] rows, in slab order."""
    err = ErrorSums(numel=numel)
    nan_byte = 0x7F if fmt.name == "e4m3fn" else -128
    for norm_err, norm_ref, neg, pos, probe, ref in per_slab.tolist():
        err.sum_sq_err += norm_err**2
        err.sum_sq_ref += norm_ref**2
        err.max_abs_err = max(err.max_abs_err, neg, pos)
        err.max_abs_ref = max(err.max_abs_ref, ref)
        err.fp8_nan += probe == nan_byte
    return err


def _slab_error(f, a, q, scale, amax_max, fmt: FP8Format, split, y, b) -> torch.Tensor:
    """Error figures of dequant(q) against f (a = |f|), using y and b as scratch: a [6] tensor, so that no
    slab waits for a conversion to Python (see `_error_sums`).

    Round-to-nearest keeps the sign, so deq and f never have opposite signs and |deq - f| = ||deq| - |f||:
    only the magnitude bits are decoded (see `fp8_to_float`).
    """
    torch.bitwise_and(q.view(torch.uint8), 0x7F, out=b)
    # NaN bit patterns: fn S.1111.111 (largest magnitude byte 0x7F), fnuz 1.0000.000 (int8 -128)
    nan_probe = b.max() if fmt.name == "e4m3fn" else q.view(torch.int8).min()
    bits = y.view(torch.int32)
    bits.copy_(b)
    bits.bitwise_left_shift_(20)
    d = bits.view(torch.float32)  # |q| * 2^(bias - 127)
    d_main, d_tail = split(d)
    factor = 2.0 ** (127 - fmt.exponent_bias)
    if bool(torch.isfinite(scale * factor).all()):  # one multiply by (scale x factor) per element
        scale = scale * factor
    else:  # block scales above ~2^8, i.e. |w| > ~10^5: two multiplies, or scale x factor would overflow
        d.mul_(factor)
    if d_main.shape[2]:
        d_main.mul_(scale[:, None, : d_main.shape[2], None])
    if d_tail.shape[2]:
        d_tail.mul_(scale[:, d_main.shape[2] :, None])
    d.sub_(a)  # |deq| - |w|
    # vector_norm, not dot: MKL's dot stalls ~10 ms a call on busy cores.
    lo, hi = torch.aminmax(d)
    return torch.cat([torch.stack([torch.linalg.vector_norm(d), torch.linalg.vector_norm(a), -lo, hi,
                                   nan_probe.float()]), amax_max])
