"""The converter's output bytes are fixed: every tensor and every block scale of a small checkpoint made here
(BF16 and FP32 inputs, shapes that are and are not multiples of 128, a stacked-expert 3-D tensor, zero blocks,
tiny and huge values) hashes to digests recorded from the single-threaded converter of commit fed2839, before
it was made faster; and the threaded quantiser gives the same bytes as a whole-tensor reference written as
plain torch ops (block amax, scale = amax / max, multiply by 1/scale, clamp, cast)."""

import hashlib
import json

import pytest
import torch
from safetensors import safe_open

import repro.fp8.quant as quant
from repro.fp8.convert import ConvertOptions, convert_checkpoint
from repro.fp8.quant import get_format, quantize_block, quantize_block_with_error

SHARDS = {
    "model-00001-of-00002.safetensors": [
        ("model.embed_tokens.weight", (300, 200), torch.bfloat16, 1.0),
        ("model.layers.0.mlp.gate_proj.weight", (384, 256), torch.bfloat16, 0.02),
        ("model.layers.0.mlp.down_proj.weight", (200, 300), torch.bfloat16, 0.02),
        ("model.layers.0.self_attn.q_proj.weight", (130, 260), torch.float32, 0.05),
        ("model.layers.0.input_layernorm.weight", (200,), torch.bfloat16, 1.0),
    ],
    "model-00002-of-00002.safetensors": [
        ("model.layers.0.self_attn.o_proj.weight", (1000, 1100), torch.float32, 0.01),
        ("model.layers.0.mlp.up_proj.weight", (640, 1536), torch.bfloat16, 0.02),
        ("model.layers.1.mlp.experts.gate_up_proj", (3, 260, 130), torch.bfloat16, 0.03),
        ("model.norm.weight", (200,), torch.bfloat16, 1.0),
    ],
}

# sha256 (first 16 hex digits) of each output tensor's bytes, written by the converter at commit fed2839
RECORDED = {
    ("e4m3fn", False): {
        "model.embed_tokens.weight": "30cc4bb8965150af",
        "model.layers.0.input_layernorm.weight": "fad35b193597e99a",
        "model.layers.0.mlp.down_proj.weight": "645b07542d1aed52",
        "model.layers.0.mlp.down_proj.weight_scale_inv": "a587c1e9ad827df3",
        "model.layers.0.mlp.gate_proj.weight": "5feb26ecbefb1eef",
        "model.layers.0.mlp.gate_proj.weight_scale_inv": "dd740678213ca759",
        "model.layers.0.self_attn.q_proj.weight": "4b646dc5b73a39df",
        "model.layers.0.self_attn.q_proj.weight_scale_inv": "7f495eaec7194d07",
        "model.layers.0.mlp.up_proj.weight": "96a0db40849debe8",
        "model.layers.0.mlp.up_proj.weight_scale_inv": "f30bd4d3e1589509",
        "model.layers.0.self_attn.o_proj.weight": "9a815ac0953a0ac8",
        "model.layers.0.self_attn.o_proj.weight_scale_inv": "2622c5ba609fd543",
        "model.layers.1.mlp.experts.gate_up_proj": "8ad3dd23c7c06dbe",
        "model.layers.1.mlp.experts.gate_up_proj_scale_inv": "a866d20b521ffdd2",
        "model.norm.weight": "772b2271749549ee",
    },
    ("e4m3fnuz", True): {
        "model.embed_tokens.weight": "30cc4bb8965150af",
        "model.layers.0.input_layernorm.weight": "fad35b193597e99a",
        "model.layers.0.mlp.down_proj.weight": "0a15479ec52bd8a4",
        "model.layers.0.mlp.down_proj.weight_scale_inv": "07e0cd9d2f7a91e4",
        "model.layers.0.mlp.gate_proj.weight": "d25ed1f24607981e",
        "model.layers.0.mlp.gate_proj.weight_scale_inv": "07e0cd9d2f7a91e4",
        "model.layers.0.self_attn.q_proj.weight": "2e8711f561425b66",
        "model.layers.0.self_attn.q_proj.weight_scale_inv": "465c48dbf28da436",
        "model.layers.0.mlp.up_proj.weight": "a589d4748b88c887",
        "model.layers.0.mlp.up_proj.weight_scale_inv": "9fc76d07ce866498",
        "model.layers.0.self_attn.o_proj.weight": "9a0a374801892ca0",
        "model.layers.0.self_attn.o_proj.weight_scale_inv": "858e119a8e89f2f7",
        "model.layers.1.mlp.experts.gate_up_proj": "693b0981b4d6cf1b",
        "model.layers.1.mlp.experts.gate_up_proj_scale_inv": "ec62626be150d568",
        "model.norm.weight": "772b2271749549ee",
    },
}


def _tensor(name, shape, dtype, std, g):
    t = torch.randn(shape, generator=g) * std
    if name.endswith("up_proj.weight"):  # a zero block, a block of tiny values, and huge values (scale > 2^8)
        t[:128, :128] = 0
        t[128:256, 128:256] *= 1e-37
        t[256:384, :] *= 1e6
        t[384, 5] = -3e7
    return t.to(dtype)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from safetensors.torch import save_file

    src = tmp_path_factory.mktemp("identity") / "src"
    src.mkdir()
    g = torch.Generator().manual_seed(19)
    weight_map = {}
    for shard, specs in SHARDS.items():
        tensors = {name: _tensor(name, shape, dtype, std, g) for name, shape, dtype, std in specs}
        save_file(tensors, src / shard, metadata={"format": "pt"})
        weight_map.update({name: shard for name in tensors})
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (src / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    return src


def _digests(folder):
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                out[name] = hashlib.sha256(t.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()[:16]
    return out


@pytest.mark.parametrize("fmt,pow2,threads", [(*key, threads) for key in sorted(RECORDED) for threads in (1, 3)])
def test_converter_bytes_match_the_recorded_digests(checkpoint, tmp_path, monkeypatch, fmt, pow2, threads):
    monkeypatch.setattr(quant, "_CPU_SLAB_ELEMS", 1 << 16)  # several slabs per tensor for the threads to share
    monkeypatch.setattr(quant, "_FUSED_SLAB_FACTOR", 1)
    opts = ConvertOptions(fmt=fmt, pow2_scale=pow2, threads=threads, progress=False, fsync=False)
    got = _digests(convert_checkpoint(checkpoint, tmp_path / "out", opts).output_dir)
    assert got == RECORDED[(fmt, pow2)]


def _reference(w, fmt, pow2):
    """Whole-tensor block quantisation in plain torch ops, the arithmetic of the original slab loop."""
    f = w.float()
    *lead, n, k = f.shape
    nb, kb = -(-n // 128), -(-k // 128)
    padded = torch.zeros(*lead, nb * 128, kb * 128)
    padded[..., :n, :k] = f.abs()
    amax = padded.view(*lead, nb, 128, kb, 128).amax(dim=(-3, -1))
    scale = (amax / fmt.max).clamp(min=2.0**-126)
    if pow2:
        scale = quant._ceil_pow2(scale)
    inv = scale.reciprocal().repeat_interleave(128, -2)[..., :n, :].repeat_interleave(128, -1)[..., :k]
    return (f * inv).clamp(-fmt.max, fmt.max).to(fmt.dtype), scale


@pytest.mark.parametrize("fmt,pow2", [("e4m3fn", False), ("e4m3fnuz", False), ("e4m3fn", True), ("e4m3fnuz", True)])
def test_threaded_slabs_match_the_whole_tensor_reference(monkeypatch, fmt, pow2):
    monkeypatch.setattr(quant, "_CPU_SLAB_ELEMS", 1 << 15)  # many slabs per tensor, some split across columns
    monkeypatch.setattr(quant, "_FUSED_SLAB_FACTOR", 1)
    g = torch.Generator().manual_seed(5)
    fmt = get_format(fmt)
    for shape, dtype in (((1000, 1100), torch.float32), ((640, 1536), torch.bfloat16), ((3, 260, 130), torch.bfloat16),
                         ((130, 100), torch.bfloat16)):
        w = _tensor("x.up_proj.weight" if shape == (640, 1536) else "x", shape, torch.float32, 0.02, g).to(dtype)
        want_q, want_s = _reference(w, fmt, pow2)
        for threads in (1, 2, 3):
            q, s, err = quantize_block_with_error(w, fmt, pow2_scale=pow2, threads=threads)
            assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)), (shape, threads)
            assert torch.equal(s, want_s), (shape, threads)
            d = quant.dequantize_block(q, s).double() - w.double()
            assert err.numel == w.numel() and err.fp8_nan == 0
            assert err.rel_error == pytest.approx(float(d.norm() / w.double().norm()), rel=1e-5)
            assert err.max_abs_err == pytest.approx(float(d.abs().max()), rel=1e-6)
            assert err.max_abs_ref == float(w.float().abs().max())
        assert torch.equal(quantize_block(w, fmt, pow2_scale=pow2, threads=2)[0].view(torch.uint8),
                           want_q.view(torch.uint8))


def test_a_non_finite_value_in_any_slab_is_refused_with_threads(monkeypatch):
    monkeypatch.setattr(quant, "_CPU_SLAB_ELEMS", 1 << 15)
    monkeypatch.setattr(quant, "_FUSED_SLAB_FACTOR", 1)
    for bad in (float("nan"), float("inf"), -float("inf")):
        w = torch.zeros(512, 512)
        w[400, 300] = bad
        with pytest.raises(quant.NonFiniteInputError):
            quantize_block_with_error(w, "e4m3fnuz", threads=2)


@pytest.mark.parametrize("fmt", ["e4m3fn", "e4m3fnuz"])
def test_the_cast_rounds_values_just_above_max_down_to_max(fmt):
    """Why the quantiser needs no clamp: x / (amax / max) overshoots max by a few ulps at most, and torch's cast
    rounds anything below the midpoint to the next binade (464 for e4m3fn, 248 for e4m3fnuz) to ±max."""
    fmt = get_format(fmt)
    above = torch.tensor([fmt.max * (1 + k * 2.0**-23) for k in range(1, 65)] + [fmt.max * 1.03])
    for x in (above, -above):
        assert torch.equal(x.to(fmt.dtype).float(), torch.full_like(x, float(x[0].sign()) * fmt.max))
    # and the slab quantiser's own arithmetic: amax/max, its reciprocal, times amax, for many amax values
    amax = torch.rand(100000, dtype=torch.float64).mul(60).sub(30).exp2().float()
    scale = (amax / fmt.max).clamp(min=2.0**-126)
    for s in (scale, quant._ceil_pow2(scale)):
        y = amax * s.reciprocal()
        assert float(y.max()) < fmt.max * (1 + 2.0**-20)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_fp8_written_over_the_input_gives_the_same_bytes(monkeypatch, threads):
    monkeypatch.setattr(quant, "_CPU_SLAB_ELEMS", 1 << 14)  # many slabs, each overwriting earlier slabs' input
    monkeypatch.setattr(quant, "_FUSED_SLAB_FACTOR", 1)
    g = torch.Generator().manual_seed(7)
    for shape, dtype in (((1000, 1100), torch.float32), ((640, 1536), torch.bfloat16), ((3, 260, 130), torch.bfloat16),
                         ((130, 100), torch.float32)):
        w = _tensor("x.up_proj.weight" if shape == (640, 1536) else "x", shape, torch.float32, 0.02, g).to(dtype)
        want_q, want_s, want_err = quantize_block_with_error(w, "e4m3fnuz")
        scratch = w.clone()
        q, s, err = quantize_block_with_error(scratch, "e4m3fnuz", threads=threads, overwrite_input=True)
        assert q.untyped_storage().data_ptr() == scratch.untyped_storage().data_ptr()  # no new allocation
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(s, want_s)
        # whole-row slabs here: the same figures up to the order of the fp32 sums
        assert err.max_abs_err == want_err.max_abs_err and err.max_abs_ref == want_err.max_abs_ref
        assert err.rel_error == pytest.approx(want_err.rel_error, rel=1e-5)
    strided = torch.randn(256, 512).t()  # not contiguous: quantised into fresh memory, the input left alone
    before = strided.clone()
    q, _, _ = quantize_block_with_error(strided, "e4m3fn", overwrite_input=True)
    assert torch.equal(strided, before)
    assert torch.equal(q.view(torch.uint8), quantize_block(before, "e4m3fn")[0].view(torch.uint8))
