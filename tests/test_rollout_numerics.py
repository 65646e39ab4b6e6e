"""The rollout's vLLM-like numerics: exact values of each quantiser on hand-built tensors, and the hooks/cache."""

import pytest
import torch
from transformers import DynamicCache

from repro.model.tiny import BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID, build_tiny_model, tiny_config
from repro.recipes import load_recipe
from repro.rollout.embedded import EmbeddedEngine
from repro.rollout.fp8_view import FP8WeightView
from repro.rollout.numerics import (
    RolloutNumerics, dequantize_per_token_group, fake_quant_activation, kv_cache_round_trip,
    per_tensor_fp8_round_trip, quantize_per_token_group, round_to_bf16, ue8m0_fp8_round_trip,
)
from repro.rollout.types import SamplingParams


def test_per_token_group_quantiser_by_hand():
    x = torch.tensor([[1.0, -2.0, 4.0, 0.5], [0.0, 0.0, 0.0, 0.0], [1.0, 0.3, -0.25, 0.125]])
    q, scale = quantize_per_token_group(x, group=2)
    # scale = amax / 448 per (row, pair); a zero group gets eps / 448 and quantises to zeros
    assert torch.equal(scale, torch.tensor([[2 / 448, 4 / 448], [1e-10 / 448] * 2, [1 / 448, 0.25 / 448]]))
    assert q.dtype == torch.float8_e4m3fn
    # 0.3 * 448 = 134.4 lies between e4m3 neighbours 128 and 144: nearest is 128
    assert torch.equal(q.float(),
                       torch.tensor([[224.0, -448.0, 448.0, 56.0], [0.0] * 4, [448.0, 128.0, -448.0, 224.0]]))
    back = dequantize_per_token_group(q, scale)
    assert torch.equal(back[2],
                       torch.tensor([448.0, 128.0, -448.0, 224.0]) * torch.tensor([1 / 448] * 2 + [0.25 / 448] * 2))
    assert torch.equal(fake_quant_activation(x, group=2), back)


def test_fnuz_uses_vllms_224_range_and_narrow_rows_are_one_group():
    q, scale = quantize_per_token_group(torch.tensor([[1.0, -2.0]]), group=128, fmt="e4m3fnuz")
    assert q.dtype == torch.float8_e4m3fnuz and torch.equal(q.float(), torch.tensor([[112.0, -224.0]]))
    assert torch.equal(scale, torch.tensor([[2 / 224]]))
    with pytest.raises(ValueError, match="192 is not a multiple of the group size 128"):
        quantize_per_token_group(torch.ones(2, 192), group=128)
    bf = round_to_bf16(torch.tensor([1.0 + 2**-8, 1.0 + 3 * 2**-8]))  # ties to even: 1.0, 1 + 2**-6
    assert torch.equal(bf, torch.tensor([1.0, 1.0 + 2**-6]))


def test_kv_cache_fp8_ds_mla_round_trip_by_hand():
    nope = torch.tensor([3.0, 0.01, -1.0, 0.0])
    # amax 3 -> scale 2**ceil(log2(3/448)) = 2**-7; 0.01 is bf16 0.010009765625 -> 1.28125 / 2**-7 -> e4m3 1.25
    assert torch.equal(ue8m0_fp8_round_trip(nope), torch.tensor([3.0, 1.25 * 2**-7, -1.0, 0.0]))
    assert torch.equal(ue8m0_fp8_round_trip(torch.zeros(3)), torch.zeros(3))  # amax floor 1e-4, no NaN
    kv = torch.cat([nope, torch.tensor([1.0 + 2**-8, -0.3])])[None, None]  # [1, 1, 6]: 4 NoPE + 2 RoPE
    stored = kv_cache_round_trip(kv, rope_dim=2)
    assert stored.shape == kv.shape and stored.dtype == torch.float32
    # RoPE channels only BF16-rounded (no FP8): 1 + 2**-8 ties to 1.0, -0.3 to bf16's -0.30078125
    assert torch.equal(stored[0, 0], torch.tensor([3.0, 1.25 * 2**-7, -1.0, 0.0, 1.0, -0.30078125]))
    # two 64-channel blocks get their own scales
    two = torch.cat([torch.full((64,), 3.0), torch.full((64,), 0.01)])
    # (the second alone: scale 2**-15, 0.010009765625 / 2**-15 = 328 -> e4m3 320, i.e. 0.009765625; with the
    # first block's scale 2**-7 it would have been 1.25 * 2**-7)
    assert torch.equal(ue8m0_fp8_round_trip(two)[63:65], torch.tensor([3.0, 320 * 2**-15]))


def test_wrapped_cache_stores_the_round_trip():
    config = tiny_config()
    numerics = RolloutNumerics(kv_cache_fp8=True)
    cache = numerics.wrap_cache(DynamicCache(config=config), config)
    kv = torch.randn(2, 1, 5, config.head_dim, generator=torch.Generator().manual_seed(0))
    full, _ = cache.layers[1].update(kv, kv)
    expected = kv_cache_round_trip(kv, config.qk_rope_head_dim)
    assert torch.equal(full, expected) and torch.equal(cache.layers[1].keys, expected)
    assert cache.layers[1].values is cache.layers[1].keys  # K=V stays one tensor
    compressed = torch.randn(2, 3, config.head_dim)
    kept = cache.layers[1].update_compressor_states("compressor", compressed)
    assert torch.equal(kept, kv_cache_round_trip(compressed, config.qk_rope_head_dim))
    keys = torch.randn(2, 3, config.index_head_dim)
    kept = cache.layers[1].update_compressor_states("indexer", keys)
    assert torch.equal(kept, ue8m0_fp8_round_trip(keys, block=config.index_head_dim))
    assert RolloutNumerics().wrap_cache(plain := DynamicCache(config=config), config) is plain


def test_other_models_get_vllms_per_tensor_fp8_cache(tmp_path):
    """vLLM's generic fp8_e4m3 cache (k_scale = v_scale = 1.0): a plain e4m3 cast, here on the Qwen3-MoE lane's
    model."""
    # step near 0.3: 1/32; 1e-3 = 0.512 subnormal steps of 2**-9
    assert torch.equal(per_tensor_fp8_round_trip(torch.tensor([0.3, 500.0, -1e-3])),
                       torch.tensor([0.3125, 448.0, -2**-9]))
    from repro.model.hf_folder import load_checkpoint
    from repro.model.tiny_qwen3_moe import build_tiny_qwen3_moe

    model, tokenizer = load_checkpoint(build_tiny_qwen3_moe(tmp_path / "qwen"))
    numerics = RolloutNumerics(True, 128, True, True)
    engine = EmbeddedEngine(model, tokenizer.eos_token_id, tokenizer.pad_token_id, 16, numerics=numerics)
    result = engine.generate([[1, 2, 3]], SamplingParams(n=2, max_new_tokens=3, seed=0))
    assert all(torch.isfinite(t.logprobs).all() for t in result.trajectories)
    cache = numerics.wrap_cache(DynamicCache(config=model.config), model.config)
    k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    keys, values = cache.layers[0].update(k, v)
    assert torch.equal(keys, per_tensor_fp8_round_trip(k)) and torch.equal(values, per_tensor_fp8_round_trip(v))


def test_hooks_quantise_the_inputs_of_fp8_linears_only():
    model = build_tiny_model(0)
    numerics = RolloutNumerics(activation_quant=True)
    numerics.install(model)
    # every attention/shared-expert linear and the routed experts; not the LM head, compressors or scorer
    assert "lm_head" not in numerics.hooked and "model.layers.1.mlp.experts" in numerics.hooked
    assert not any("compressor.kv_proj" in n or "weights_proj" in n for n in numerics.hooked)
    # per layer q_a q_b kv o_a o_b, shared x3, experts, indexer q_b
    assert len(numerics.hooked) == 4 * 5 + 4 * 3 + 1 * 4 + 2
    layer = model.model.layers[0].self_attn.q_a_proj
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(1))
    assert torch.equal(layer(x), torch.nn.functional.linear(fake_quant_activation(x), layer.weight))
    bf16 = RolloutNumerics(bf16_activations=True)
    plain = build_tiny_model(0)
    bf16.install(model := build_tiny_model(0))
    head = model.lm_head
    assert torch.equal(head(x), round_to_bf16(plain.lm_head(x)))


def _engine(model, numerics):
    return EmbeddedEngine(model, EOS_TOKEN_ID, PAD_TOKEN_ID, 24, FP8WeightView(), numerics=numerics)


def test_engine_with_numerics_off_is_unchanged_and_on_differs():
    model = build_tiny_model(0)
    prompts = [[BOS_TOKEN_ID, 5, 6, 7], [BOS_TOKEN_ID, 8, 9, 10]]
    params = SamplingParams(n=3, max_new_tokens=4, seed=4)
    off = _engine(model, RolloutNumerics())
    assert off.numerics.hooked == []  # numerics off: the model is not touched, so the engine is as before
    on_engine = _engine(model, RolloutNumerics(True, 128, True, True))
    base, on, again = (off.generate(prompts, params), on_engine.generate(prompts, params),
                       on_engine.generate(prompts, params))
    lp = lambda r: torch.cat([t.logprobs for t in r.trajectories])  # noqa: E731
    assert torch.equal(lp(on), lp(again)) and torch.isfinite(lp(on)).all()
    assert not torch.equal(lp(on), lp(base))


def test_recipe_fields_map_to_numerics():
    tiny = load_recipe("tiny-cpu")
    numerics = RolloutNumerics.from_rollout(tiny.rollout)
    assert (numerics.activation_quant, numerics.bf16_activations, numerics.kv_cache_fp8) == (True, True, True)
    assert numerics.fp8_format == "e4m3fn" and numerics.activation_group == 128
    assert tiny.actor.dtype == "bf16"  # AMD's actor: BF16 compute on fp32 masters
    bf16_weights = load_recipe("tiny-cpu", ["rollout.weight_format=bf16", "rollout.kv_cache_dtype=auto",
                                            "rollout.activation_dtype=fp32"])
    assert not RolloutNumerics.from_rollout(bf16_weights.rollout).active  # W8A8 needs FP8 weights
    with pytest.raises(Exception, match="activation_quant"):
        load_recipe("tiny-cpu", ["rollout.activation_quant=int8"])
