"""e4m3fn -> e4m3fnuz, bit for bit against vLLM's `normalize_e4m3fn_to_e4m3fnuz` rule, on all 256 bytes."""

import json

import pytest
import torch
from safetensors import safe_open

from repro.fp8.convert import ConvertOptions, convert_checkpoint
from repro.fp8.quant import dequantize_block, e4m3fn_to_e4m3fnuz, quantize_block
from repro.fp8.stream import fn_to_fnuz_tensors
from repro.model.tiny import build_tiny_checkpoint


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
    out = dict(fn_to_fnuz_tensors([("a.weight", q), ("norm.weight", torch.ones(3)), ("a.weight_scale_inv", s)]))
    assert out["a.weight"].dtype == torch.float8_e4m3fnuz
    assert torch.equal(out["a.weight_scale_inv"], s * 2)
    assert torch.equal(out["norm.weight"], torch.ones(3))
    assert torch.equal(dequantize_block(out["a.weight"], out["a.weight_scale_inv"]), dequantize_block(q, s))


def test_checkpoint_fn_to_fnuz_equals_direct_dequant(tmp_path):
    bf16 = build_tiny_checkpoint(tmp_path / "bf16", max_shard_size="2MB")
    fn = convert_checkpoint(bf16, tmp_path / "fn", ConvertOptions(fmt="e4m3fn", progress=False, fsync=False))
    fnuz = convert_checkpoint(fn.output_dir, tmp_path / "fnuz", ConvertOptions(fmt="e4m3fnuz", progress=False, fsync=False))
    assert fnuz.mode == "fn->fnuz"
    cfg = json.loads((tmp_path / "fnuz" / "config.json").read_text())
    assert cfg["quantization_config"]["fp8_dtype"] == "float8_e4m3fnuz"
    index = json.loads((tmp_path / "fnuz" / "model.safetensors.index.json").read_text())["weight_map"]
    n_fp8 = 0
    for name, shard in index.items():
        if not name.endswith("_scale_inv"):
            continue
        w = name.removesuffix("_scale_inv")
        with safe_open(tmp_path / "fn" / shard, "pt") as a, safe_open(tmp_path / "fnuz" / shard, "pt") as b:
            qa, sa = a.get_tensor(w), a.get_tensor(name)
            qb, sb = b.get_tensor(w), b.get_tensor(name)
        assert qb.dtype == torch.float8_e4m3fnuz and torch.equal(sb, sa * 2)
        assert torch.equal(dequantize_block(qa, sa), dequantize_block(qb, sb))
        n_fp8 += 1
    assert n_fp8 == fn.summary["tensors_fp8"] > 100
