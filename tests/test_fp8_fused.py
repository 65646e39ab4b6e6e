"""The compiled BF16 quantiser (repro/fp8/kernels/quantize_bf16.c via repro.fp8.fused) gives the torch path's
bytes and scales, error figures that match an exact float64 reference, and the torch path where it cannot be
built; the converter's pread-per-slab input gives the same result as reading whole tensors."""

import math
import os
import warnings

import pytest
import torch

import repro.fp8.fused as fused
import repro.fp8.quant as quant
from repro.errors import CheckpointError
from repro.fp8.quant import NonFiniteInputError, quantize_block_with_error

# Without a C compiler the converter still works (torch ops, test_a_failed_build_... below); the kernel's own
# tests need one, as every machine this project's CI runs on has.
needs_compiler = pytest.mark.skipif(fused._compiler() is None, reason="no C compiler on this machine")


def _torch_path(monkeypatch, w, fmt, **kw):
    monkeypatch.setattr(quant, "_USE_FUSED", False)
    try:
        return quantize_block_with_error(w.clone(), fmt, **kw)
    finally:
        monkeypatch.setattr(quant, "_USE_FUSED", True)


def _deq64(q, s):
    """Exact dequantisation in float64 (dequantize_block multiplies in fp32)."""
    s = s.double().repeat_interleave(128, -2)[..., : q.shape[-2], :].repeat_interleave(128, -1)[..., : q.shape[-1]]
    return q.to(torch.float32).double() * s


def _weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(3, 300, 520, generator=g) * 0.02  # partial block-rows and block-columns, 3 stacked experts
    w[0, :128, :128] = 0  # an all-zero block
    w[0, 128:256, :128] *= 1e-38  # BF16 subnormals: scale clamped to 2^-126, the float64 error path
    w[1, :128, 128:256] *= 1e17  # scale above 2^40: the float64 error path
    w[1, 200, 300] = -7e4  # one large value among small ones
    w[2, 256:, 512:] = 1.0  # an edge block of equal values (exact ties after scaling)
    return w.to(torch.bfloat16)


@needs_compiler
def test_the_kernel_is_built_and_used():
    assert fused.kernel() is not None  # this machine has a C compiler; the CI lane relies on it
    path = fused.build()
    assert path.exists() and path.parent == fused.cache_dir()
    assert fused.build() == path  # cached: same key, no rebuild


@pytest.mark.parametrize("fmt", ["e4m3fn", "e4m3fnuz"])
@needs_compiler
def test_cast_equals_torch_on_a_sweep_of_fp32_patterns(fmt):
    """Every 4099th fp32 bit pattern (both signs, zeros, subnormals, the overflow range, Inf, NaN) plus every
    pattern around each format's max and subnormal threshold: the kernel's rounding gives torch's bytes."""
    dtype = quant.get_format(fmt).dtype
    sweep = torch.arange(0, 1 << 32, 4099, dtype=torch.int64)
    edges = [0x43E00000, 0x43F00000, 0x43700000, 0x43780000, 0x3C800000, 0x3C000000, 0x3B800000, 0x7F800000]
    near = torch.cat([torch.arange(e - 5000, e + 5000, dtype=torch.int64) for e in edges])
    bits = torch.cat([sweep, near, near + (1 << 31)])
    y = torch.where(bits >= 1 << 31, bits - (1 << 32), bits).to(torch.int32).view(torch.float32)
    mine = fused.cast_f32(y, fmt == "e4m3fnuz")
    assert torch.equal(mine, y.to(dtype).view(torch.uint8))


@needs_compiler
@pytest.mark.parametrize("fmt,pow2", [("e4m3fn", False), ("e4m3fnuz", False), ("e4m3fnuz", True)])
@pytest.mark.parametrize("threads,in_place", [(1, False), (3, True)])
def test_same_bytes_and_scales_as_the_torch_ops(monkeypatch, fmt, pow2, threads, in_place):
    monkeypatch.setattr(quant, "_CPU_SLAB_ELEMS", 1 << 15)  # several slabs per expert
    monkeypatch.setattr(quant, "_FUSED_SLAB_FACTOR", 1)
    w = _weights()
    q_ref, s_ref, e_ref = _torch_path(monkeypatch, w, fmt, pow2_scale=pow2)
    q, s, e = quantize_block_with_error(w.clone(), fmt, pow2_scale=pow2, threads=threads, overwrite_input=in_place)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)
    # the figures: max |w| and the max error exactly, the norms to the torch path's fp32 rounding
    assert e.max_abs_ref == e_ref.max_abs_ref and e.max_abs_err == pytest.approx(e_ref.max_abs_err, rel=1e-6)
    assert e.sum_sq_ref == pytest.approx(e_ref.sum_sq_ref, rel=1e-4)
    assert e.sum_sq_err == pytest.approx(e_ref.sum_sq_err, rel=1e-3) and e.fp8_nan == 0


@needs_compiler
def test_error_figures_match_an_exact_reference():
    w = (torch.randn(640, 1024, generator=torch.Generator().manual_seed(1)) * 0.02).to(torch.bfloat16)
    q, s, e = quantize_block_with_error(w, "e4m3fnuz")
    diff = _deq64(q, s) - w.double()
    assert e.rel_error == pytest.approx((diff.norm() / w.double().norm()).item(), rel=1e-7)  # fp32 block sums
    assert e.max_abs_err == diff.abs().max().item()  # exact: |deq| - |w| in fp32 is exact at these scales
    assert e.max_abs_ref == w.abs().max().item() and e.numel == w.numel()


@needs_compiler
def test_figures_stay_finite_where_fp32_squares_would_overflow(monkeypatch):
    w = (torch.randn(256, 256, generator=torch.Generator().manual_seed(2)) * 1e30).to(torch.bfloat16)
    _, _, e_ref = _torch_path(monkeypatch, w, "e4m3fn")
    q, s, e = quantize_block_with_error(w, "e4m3fn")
    diff = _deq64(q, s) - w.double()
    assert math.isinf(e_ref.sum_sq_ref)  # the torch ops' fp32 norm overflows (and the converter would refuse w)
    assert e.rel_error == pytest.approx((diff.norm() / w.double().norm()).item(), rel=1e-9)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_input_is_refused(bad):
    w = torch.randn(256, 256).to(torch.bfloat16)
    w[200, 17] = bad
    with pytest.raises(NonFiniteInputError):
        quantize_block_with_error(w, "e4m3fn", threads=2)


def test_a_failed_build_names_the_compiler_and_falls_back(monkeypatch, tmp_path):
    fake = tmp_path / "fakecc"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo fake 1.0; exit 0; fi\n"
                    "echo 'fakecc: no such flag' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(RuntimeError, match=r"fakecc could not build .*quantize_bf16\.c: fakecc: no such flag"):
        fused.build(cc=str(fake), directory=tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*.so"))  # nothing half-written left behind
    monkeypatch.setenv("CC", str(fake))
    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(fused, "_kernel", None)
    w = _weights()
    with pytest.warns(UserWarning, match="FP8 quantiser: using torch ops"):
        q, s, _ = quantize_block_with_error(w.clone(), "e4m3fn")
    assert fused.kernel() is None  # decided once
    monkeypatch.setattr(fused, "_kernel", None)
    monkeypatch.delenv("CC")
    monkeypatch.delenv("REPRO_CACHE_DIR")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q2, s2, _ = quantize_block_with_error(w.clone(), "e4m3fn")
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s, s2)


def test_reading_by_slab_equals_reading_whole_tensors(monkeypatch, tmp_path):
    from repro.fp8.safetensors_io import read_header, tensor_filler

    monkeypatch.setattr(quant, "_CPU_SLAB_ELEMS", 1 << 15)
    monkeypatch.setattr(quant, "_FUSED_SLAB_FACTOR", 1)
    from safetensors.torch import save_file

    w = _weights()
    path = tmp_path / "w.safetensors"
    save_file({"a": w[0].clone(), "b": w}, path)
    infos, _ = read_header(path)
    buffer = torch.empty(w.numel() * 2, dtype=torch.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        for info in infos:
            t, fill = tensor_filler(fd, info, path, buffer)
            q, s, e = quantize_block_with_error(t, "e4m3fnuz", threads=2, overwrite_input=True, fill=fill)
            src = w[0] if info.name == "a" else w
            q_ref, s_ref, e_ref = quantize_block_with_error(src.clone(), "e4m3fnuz")
            assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)
            assert math.isclose(e.rel_error, e_ref.rel_error, rel_tol=1e-12)
    finally:
        os.close(fd)
    # a file cut short: the slab that reaches the missing bytes names the file and the tensor
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[:-1000])
    fd = os.open(cut, os.O_RDONLY)
    try:
        t, fill = tensor_filler(fd, infos[1], cut, buffer)
        with pytest.raises(CheckpointError, match=r"cut\.safetensors: tensor b: truncated while reading"):
            quantize_block_with_error(t, "e4m3fnuz", threads=2, overwrite_input=True, fill=fill)
    finally:
        os.close(fd)


@needs_compiler
def test_a_compiler_without_march_native_gets_a_portable_build(tmp_path):
    real = fused._compiler()
    picky = tmp_path / "pickycc"
    picky.write_text("#!/bin/sh\n"
                     "for a in \"$@\"; do [ \"$a\" = -march=native ] && { echo 'unknown -march' >&2; exit 1; }; done\n"
                     f"exec {real} \"$@\"\n")
    picky.chmod(0o755)
    path = fused.build(cc=str(picky), directory=tmp_path / "cache")
    assert path.exists() and path.parent == tmp_path / "cache" and len(list(path.parent.iterdir())) == 1
