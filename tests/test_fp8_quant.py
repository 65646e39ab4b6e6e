"""Block FP8 quantiser: shapes, scales, the error bound, edge blocks, and the fast paths against references."""

import math

import pytest
import torch

from repro.fp8.quant import (
    E4M3FN,
    E4M3FNUZ,
    FORMATS,
    NonFiniteInputError,
    dequantize_block,
    fp8_to_float,
    get_format,
    quantize_block,
    quantize_block_with_error,
)
from repro.fp8.verify import REL_ROUNDING_BOUND, element_error_bound, max_abs_error_bound, rel_error_bound

# Shapes that are and are not multiples of 128, including thin ones and a 3-D expert stack.
SHAPES = [(256, 384), (300, 200), (1, 129), (129, 1), (127, 4096), (130, 130), (3, 200, 136)]
FMTS = ["e4m3fn", "e4m3fnuz"]


def _weights(shape, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g) * 0.02
    # heavy tails and a spread of block magnitudes, like trained weights
    w = w * torch.exp(torch.randn(shape, generator=g))
    return w.to(dtype)


def _naive_scales(w, fmt, block=128):
    """Loop reference: one amax per 128x128 block."""
    *lead, n, k = w.shape
    w3 = w.float().reshape(-1, n, k)
    out = torch.empty(w3.shape[0], -(-n // block), -(-k // block))
    for e in range(w3.shape[0]):
        for i in range(out.shape[1]):
            for j in range(out.shape[2]):
                blk = w3[e, i * block : (i + 1) * block, j * block : (j + 1) * block]
                out[e, i, j] = max(blk.abs().max().item() / fmt.max, 2.0**-126)
    return out.reshape(*lead, out.shape[1], out.shape[2])


def test_formats_match_torch():
    for f in FORMATS.values():
        assert f.max == torch.finfo(f.dtype).max
    assert (E4M3FN.max, E4M3FNUZ.max) == (448.0, 240.0)
    assert E4M3FN.min_normal == torch.finfo(torch.float8_e4m3fn).smallest_normal == 2.0**-6
    assert E4M3FNUZ.min_normal == torch.finfo(torch.float8_e4m3fnuz).smallest_normal == 2.0**-7
    assert get_format("float8_e4m3fnuz") is E4M3FNUZ and get_format(torch.float8_e4m3fn) is E4M3FN


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_scales_shapes_and_error_bound(shape, fmt):
    f = get_format(fmt)
    w = _weights(shape)
    q, s = quantize_block(w, fmt)
    *lead, n, k = shape
    assert q.dtype == f.dtype and q.shape == w.shape
    assert s.dtype == torch.float32 and tuple(s.shape) == (*lead, math.ceil(n / 128), math.ceil(k / 128))
    torch.testing.assert_close(s, _naive_scales(w, f), rtol=0, atol=0)  # edge blocks use their own amax
    deq = dequantize_block(q, s)
    assert torch.isfinite(deq).all()
    s_full = s.repeat_interleave(128, -2)[..., :n, :].repeat_interleave(128, -1)[..., :k]
    err = (deq - w.float()).abs()
    assert (err <= element_error_bound(w, s_full, f)).all()  # bound (1), element by element
    rel = ((deq - w.float()).norm() / w.float().norm()).item()
    assert rel <= rel_error_bound(fmt)  # bound (2)
    assert 0.015 < rel < 0.04  # what random weights actually get (~0.026)
    # each block's largest element is represented to within 2^-4
    assert err.max().item() <= max_abs_error_bound(w.float().abs().max().item(), fmt)


def test_error_bound_is_tight_for_normals():
    """The worst case 2^-4 is reached: a value halfway between two e4m3 grid points (1 + 1/16)."""
    w = torch.full((128, 128), 1.0)
    w[0, 0] = 448.0  # sets the block scale to 1.0 exactly
    w[1, 1] = 1.0 + 1 / 16  # halfway between 1.0 and 1.125 -> rounds to even (1.0)
    q, s = quantize_block(w, "e4m3fn")
    assert s.item() == 1.0
    deq = dequantize_block(q, s)
    rel = abs(deq[1, 1].item() - w[1, 1].item()) / w[1, 1].item()
    assert rel == pytest.approx((1 / 16) / (1 + 1 / 16))
    assert rel <= REL_ROUNDING_BOUND


@pytest.mark.parametrize("fmt", FMTS)
def test_fast_error_pass_matches_reference(fmt):
    for i, shape in enumerate(SHAPES):
        w = _weights(shape, seed=i)
        q, s, err = quantize_block_with_error(w, fmt)
        q2, s2 = quantize_block(w, fmt)
        assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s, s2)
        d = dequantize_block(q, s) - w.float()
        assert err.numel == w.numel() and err.fp8_nan == 0
        assert err.rel_error == pytest.approx((d.norm() / w.float().norm()).item(), rel=1e-4)
        assert err.max_abs_err == pytest.approx(d.abs().max().item(), rel=1e-6)
        assert err.max_abs_ref == w.float().abs().max().item()


def test_slabs_match_whole_tensor_quantisation(monkeypatch):
    """The cache-sized CPU slabs give bit-identical results to one whole-tensor pass."""
    import repro.fp8.quant as quant

    w = _weights((1000, 600), seed=3)
    q1, s1 = quantize_block(w)
    monkeypatch.setattr(quant, "_CPU_SLAB_ELEMS", 1 << 40)
    q2, s2 = quantize_block(w)
    assert torch.equal(q1.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s1, s2)


@pytest.mark.parametrize("fmt", FMTS)
def test_fp8_to_float_matches_torch_cast_on_all_256_patterns(fmt):
    f = get_format(fmt)
    q = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(f.dtype)
    ref = q.float()
    got = fp8_to_float(q)
    finite = torch.isfinite(ref)
    assert int((~finite).sum()) == (2 if fmt == "e4m3fn" else 1)  # fn: 0x7F, 0xFF; fnuz: 0x80
    assert torch.equal(got[finite], ref[finite])
    assert torch.equal(torch.signbit(got[finite]), torch.signbit(ref[finite]))  # -0 kept in fn


@pytest.mark.parametrize("fmt", FMTS)
def test_no_overflow_to_nan_at_the_format_max(fmt):
    """Values that land on or a rounding step above ±max must clamp, not become NaN (fnuz)."""
    f = get_format(fmt)
    w = torch.tensor([[1.0, -1.0, 0.999999, -0.5, 1e-30, 0.0]]).repeat(3, 1)
    q, s = quantize_block(w, fmt)
    assert not torch.isnan(q.float()).any()
    assert q.float().abs().max().item() == f.max
    # an unclamped cast would have produced NaN in fnuz for anything past 240
    assert torch.isnan(torch.tensor([241.0 * 1.1]).to(torch.float8_e4m3fnuz).float()).item() or fmt == "e4m3fn"


def test_zero_and_tiny_blocks():
    w = torch.zeros(130, 130)
    w[129, 129] = 1e-30
    q, s = quantize_block(w)
    assert torch.isfinite(s).all() and (s > 0).all()
    deq = dequantize_block(q, s)
    assert deq[:128, :128].abs().max() == 0 and torch.isfinite(deq).all()
    assert deq[129, 129].item() == pytest.approx(1e-30, rel=0.07)


@pytest.mark.parametrize("fmt", FMTS)
def test_pow2_scales(fmt):
    f = get_format(fmt)
    w = _weights((300, 260), seed=5)
    q, s = quantize_block(w, fmt, pow2_scale=True)
    exact = _naive_scales(w, f)
    mantissa, _ = torch.frexp(s)
    assert (mantissa == 0.5).all()  # powers of two
    assert (s >= exact).all() and (s < 2 * exact).all()  # rounded UP, by less than 2x
    deq = dequantize_block(q, s)
    assert ((deq - w.float()).norm() / w.float().norm()).item() <= rel_error_bound(fmt, pow2_scale=True)
    # power-of-two scale of an exact power of two is itself
    w2 = torch.full((128, 128), 1e-4)
    w2[0, 0] = f.max * 2.0**-10
    assert quantize_block(w2, fmt, pow2_scale=True)[1].item() == 2.0**-10


def test_nonfinite_input_raises():
    for bad in (float("nan"), float("inf"), float("-inf")):
        w = torch.ones(200, 300)
        w[150, 250] = bad
        with pytest.raises(NonFiniteInputError):
            quantize_block(w)


def test_accepts_fp16_and_fp32_and_rejects_others():
    for dtype in (torch.float16, torch.float32):
        q, s = quantize_block(_weights((64, 64), dtype=dtype))
        assert q.dtype == torch.float8_e4m3fn
    with pytest.raises(TypeError):
        quantize_block(torch.ones(4, 4, dtype=torch.float64))
    with pytest.raises(ValueError):
        quantize_block(torch.ones(4))


def test_error_pass_with_huge_values():
    """Block scales above 2^8 take the two-multiply branch of the error pass; figures still match."""
    w = _weights((300, 200), seed=7).float() * 1e7
    q, s, err = quantize_block_with_error(w)
    assert s.max().item() > 2**8
    d = dequantize_block(q, s) - w
    assert err.rel_error == pytest.approx((d.norm() / w.norm()).item(), rel=1e-4)
    assert err.max_abs_err == pytest.approx(d.abs().max().item(), rel=1e-6)
