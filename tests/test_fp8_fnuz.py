"""e4m3fn -> e4m3fnuz, bit for bit against vLLM's `normalize_e4m3fn_to_e4m3fnuz` rule, on all 256 bytes."""

import json

import pytest
import torch

from repro.fp8.convert import ConvertOptions, convert_checkpoint
from repro.fp8.quant import dequantize_block, e4m3fn_to_e4m3fnuz, quantize_block
from repro.fp8.mxfp4 import double_scale, e8m0_to_float, float_to_e8m0
from repro.fp8.rules import pair_scales
from repro.fp8.stream import fn_to_fnuz_tensors
from repro.model.tiny_release import build_tiny_checkpoint


def vllm_normalize_e4m3fn_to_e4m3fnuz(weight, weight_scale, input_scale=None):
    """vLLM's rule as published (vllm/model_executor/layers/quantization/utils/w8a8_utils.py), in place."""
    assert weight.dtype == torch.float8_e4m3fn
    # The bits pattern 10000000(-128) represents zero in e4m3fn but NaN in e4m3fnuz. So here we set it to 0.
    weight_as_int8 = weight.view(torch.int8)
    ROCM_FP8_NAN_AS_INT = -128
    weight_as_int8[weight_as_int8 == ROCM_FP8_NAN_AS_INT] = 0
    weight = weight_as_int8.view(torch.float8_e4m3fnuz)
    # For the same bits representation, e4m3fnuz value is half of the e4m3fn value, so we should double the
    # scaling factor to get the same dequantized value.
    weight_scale = weight_scale * 2.0
    if input_scale is not None:
        input_scale = input_scale * 2.0
    return weight, weight_scale, input_scale


ALL_BYTES = torch.arange(256, dtype=torch.int32).to(torch.uint8)


def test_all_256_patterns_bit_for_bit_equal_vllm():
    fn = ALL_BYTES.clone().view(torch.float8_e4m3fn)
    scale = torch.tensor([0.37, 1.0, 2.0**-20], dtype=torch.float32)
    ours, our_scale, our_in = e4m3fn_to_e4m3fnuz(fn, scale, torch.tensor(0.5))
    theirs, their_scale, their_in = vllm_normalize_e4m3fn_to_e4m3fnuz(fn.clone(), scale, torch.tensor(0.5))
    assert ours.dtype == theirs.dtype == torch.float8_e4m3fnuz
    assert torch.equal(ours.view(torch.uint8), theirs.view(torch.uint8))
    assert torch.equal(our_scale, their_scale) and torch.equal(our_in, their_in)
    # the rule itself: byte 0x80 -> 0x00, every other byte unchanged; scales doubled exactly
    expected = ALL_BYTES.clone()
    expected[0x80] = 0
    assert torch.equal(ours.view(torch.uint8), expected)
    assert torch.equal(our_scale, scale * 2)
    assert torch.equal(fn.view(torch.uint8), ALL_BYTES)  # input untouched (vLLM's version mutates it)


def test_same_dequantised_value_for_every_finite_pattern():
    fn = ALL_BYTES.clone().view(torch.float8_e4m3fn)
    fnuz, scale2, _ = e4m3fn_to_e4m3fnuz(fn, torch.tensor(0.75))
    before = fn.float() * 0.75
    after = fnuz.float() * scale2
    finite = torch.isfinite(before)  # fn NaN patterns 0x7F/0xFF have no value to preserve
    assert int(finite.sum()) == 254
    assert torch.equal(before[finite], after[finite])  # -0 becomes +0, equal as values
    assert not torch.isnan(after).any()  # and no fn byte becomes fnuz NaN


def test_rejects_non_fn_input():
    with pytest.raises(TypeError):
        e4m3fn_to_e4m3fnuz(torch.zeros(2, dtype=torch.float8_e4m3fnuz), torch.ones(1))


def test_stream_converts_weights_and_scales_independently():
    w = torch.randn(200, 300)
    q, s = quantize_block(w, "e4m3fn")
    q.view(torch.int8)[0, :5] = -128  # some -0 bytes
    items = [("a.weight", q), ("norm.weight", torch.ones(3)), ("a.weight_scale_inv", s)]
    out = dict(fn_to_fnuz_tensors(items, pair_scales({n: t.dtype for n, t in items})))
    assert out["a.weight"].dtype == torch.float8_e4m3fnuz
    assert torch.equal(out["a.weight_scale_inv"], s * 2)
    assert torch.equal(out["norm.weight"], torch.ones(3))
    assert torch.equal(dequantize_block(out["a.weight"], out["a.weight_scale_inv"]), dequantize_block(q, s))


def _fp8(seed=0):
    q, s = quantize_block(torch.randn(130, 200, generator=torch.Generator().manual_seed(seed)) * 0.02, "e4m3fn",
                          pow2_scale=True)
    return q, s


@pytest.mark.parametrize("scale_key, encode, decode", [
    ("x.weight_scale_inv", lambda s: s, lambda s: s),                         # DeepSeek-V3 / transformers
    ("x.scale", lambda s: s, lambda s: s),                                    # DeepSeek-V4 release, FP32
    ("x.scale", float_to_e8m0, e8m0_to_float),                                # DeepSeek-V4 release, E8M0
    ("x.weight_scale", lambda s: s, lambda s: s),                             # compressed-tensors / Quark
])
def test_every_scale_convention_is_doubled_in_its_own_dtype(scale_key, encode, decode):
    q, s = _fp8()
    stored = encode(s)
    mhc = torch.tensor([0.5, 1.0, 2.0])
    items = [("x.weight", q), (scale_key, stored), ("x.input_scale", torch.tensor(0.25)),
             ("model.layers.0.attn_hc.scale", mhc), ("layers.0.hc_attn_scale", mhc)]
    scales = pair_scales({n: t.dtype for n, t in items})
    assert scales == {scale_key: "x.weight", "x.input_scale": "x.weight"}  # the mHC `scale`s pair with nothing
    out = dict(fn_to_fnuz_tensors(items, scales))
    assert out[scale_key].dtype == stored.dtype and torch.equal(decode(out[scale_key]), s * 2)
    assert float(out["x.input_scale"]) == 0.5
    assert torch.equal(out["model.layers.0.attn_hc.scale"], mhc) and torch.equal(out["layers.0.hc_attn_scale"], mhc)
    assert torch.equal(dequantize_block(out["x.weight"], decode(out[scale_key])), dequantize_block(q, s))


def test_e8m0_scale_doubling_is_one_exponent_step_and_refuses_overflow():
    s = float_to_e8m0(torch.tensor([2.0**-127, 1.0, 2.0**126]))
    assert torch.equal(double_scale(s).view(torch.uint8), s.view(torch.uint8) + 1)
    with pytest.raises(ValueError, match="E8M0"):
        double_scale(float_to_e8m0(torch.tensor([2.0**127])))


def _checkpoint_dequant(folder):
    """weight name -> dequantised fp32 of every FP8 weight of a folder, scales found by pairing."""
    from safetensors.torch import load_file

    tensors = {}
    for file in folder.glob("*.safetensors"):
        tensors.update(load_file(file))
    scales = pair_scales({n: t.dtype for n, t in tensors.items()})
    out = {}
    for scale, weight in scales.items():
        s = tensors[scale]
        s = e8m0_to_float(s) if s.dtype == torch.float8_e8m0fnu else s
        out[weight] = dequantize_block(tensors[weight], s)
    return out


@pytest.mark.parametrize("scale_dtype", ["float32", "e8m0"])
def test_a_dot_scale_checkpoint_dequantises_the_same_in_both_encodings(tmp_path, scale_dtype):
    """The release's `.scale` naming, FP32 or E8M0: the e4m3fnuz folder holds exactly the e4m3fn folder's values."""
    bf16 = build_tiny_checkpoint(tmp_path / "bf16", max_shard_size="2MB")
    fn = convert_checkpoint(bf16, tmp_path / "fn", ConvertOptions(pow2_scale=True, progress=False, fsync=False))
    if scale_dtype == "e8m0":  # store the (power-of-two) scales as the official release does
        from safetensors.torch import load_file, save_file

        for file in (tmp_path / "fn").glob("*.safetensors"):
            tensors = load_file(file)
            save_file({n: float_to_e8m0(t) if n.endswith(".scale") else t for n, t in tensors.items()}, file,
                      metadata={"format": "pt"})
    fnuz = convert_checkpoint(tmp_path / "fn", tmp_path / "fnuz", ConvertOptions(fmt="e4m3fnuz", progress=False,
                                                                                  fsync=False))
    assert fnuz.mode == "fn->fnuz"
    before, after = _checkpoint_dequant(tmp_path / "fn"), _checkpoint_dequant(tmp_path / "fnuz")
    assert len(before) == fn.summary["tensors_fp8"] == 130 and before.keys() == after.keys()
    for name in before:
        assert torch.equal(before[name], after[name]), name
    cfg = json.loads((tmp_path / "fnuz" / "config.json").read_text())
    assert cfg["quantization_config"]["fp8_dtype"] == "float8_e4m3fnuz" and cfg["expert_dtype"] == "fp8"


def test_fp8_weight_without_a_scale_and_fp4_experts_are_refused(tmp_path):
    """A checkpoint fn->fnuz cannot convert fails before writing, naming the tensor and what to do."""
    from repro.errors import CheckpointError
    from repro.fp8.official import OFFICIAL_CONFIG_KEYS
    from repro.fp8.mxfp4 import quantize_mxfp4
    from safetensors.torch import save_file

    q, s = _fp8()
    config = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
              "quantization_config": OFFICIAL_CONFIG_KEYS["quantization_config"], "expert_dtype": "fp8"}
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "config.json").write_text(json.dumps(config))
    save_file({"layers.0.attn.wq_a.weight": q}, lone / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"layers.0.attn.wq_a.weight has no block scale \(looked for "
                                              r"layers.0.attn.wq_a.weight_scale_inv, layers.0.attn.wq_a.scale"):
        convert_checkpoint(lone, tmp_path / "out", ConvertOptions(fmt="e4m3fnuz", progress=False))
    packed, fp4_scale = quantize_mxfp4(torch.randn(64, 128))
    fp4 = tmp_path / "fp4"
    fp4.mkdir()
    (fp4 / "config.json").write_text(json.dumps(config))  # expert_dtype claims fp8, the tensors say otherwise
    save_file({"layers.1.ffn.experts.0.w1.weight": packed.view(torch.int8),
               "layers.1.ffn.experts.0.w1.scale": fp4_scale},
              fp4 / "model.safetensors")
    with pytest.raises(CheckpointError,
                       match=r"w1.weight holds MXFP4.*gfx942.*gfx950.*RedHatAI/DeepSeek-V4-Flash-BF16"):
        convert_checkpoint(fp4, tmp_path / "out", ConvertOptions(fmt="e4m3fnuz", progress=False))
    (fp4 / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "expert_dtype"}))
    with pytest.raises(CheckpointError, match=r"expert_dtype absent, which vLLM reads as fp4\) holds MXFP4"):
        convert_checkpoint(fp4, tmp_path / "out", ConvertOptions(fmt="e4m3fnuz", progress=False))
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
