"""The quantise-or-keep rule over the real tensor names of DeepSeek-V4 and DeepSeek-V3.

Names come from transformers' own models built from tiny configs, in both spellings: the in-memory module
names (state_dict) and the checkpoint names that save_pretrained writes (DeepSeek's own naming for V4).
The expected FP8 set is written out here independently of repro/fp8/rules.py.
"""

import re

import pytest
import torch
from safetensors import safe_open

from repro.fp8.rules import decide, decision_table, scale_name, scale_shape
from repro.model.tiny import build_tiny_model

# Linear layers that DeepSeek ships in FP8 (every other tensor stays high precision).
V4_CHECKPOINT_FP8 = [
    r"\.attn\.(wq_a|wq_b|wkv|wo_a|wo_b)\.weight$",
    r"\.attn\.indexer\.wq_b\.weight$",
    r"\.ffn\.experts\.\d+\.(w1|w2|w3)\.weight$",
    r"\.ffn\.shared_experts\.(w1|w2|w3)\.weight$",
]
V4_MODULE_FP8 = [
    r"\.self_attn\.(q_a_proj|q_b_proj|kv_proj|o_a_proj|o_b_proj)\.weight$",
    r"\.self_attn\.compressor\.indexer\.q_b_proj\.weight$",
    r"\.mlp\.experts\.(gate_up_proj|down_proj)$",
    r"\.mlp\.shared_experts\.(gate_proj|up_proj|down_proj)\.weight$",
]
V3_FP8 = [
    r"\.self_attn\.(q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)\.weight$",
    r"\.mlp\.(gate_proj|up_proj|down_proj)\.weight$",
    r"\.mlp\.experts\.\d+\.(gate_proj|up_proj|down_proj)\.weight$",
    r"\.mlp\.experts\.(gate_up_proj|down_proj)$",
    r"\.mlp\.shared_experts\.(gate_proj|up_proj|down_proj)\.weight$",
]


def _expected(name, patterns):
    return any(re.search(p, name) for p in patterns)


@pytest.fixture(scope="module")
def v4_names(tmp_path_factory):
    model = build_tiny_model()
    module_names = [(k, tuple(v.shape), v.dtype) for k, v in model.state_dict().items()]
    path = tmp_path_factory.mktemp("v4")
    model.save_pretrained(path)
    with safe_open(path / "model.safetensors", "pt") as f:
        ckpt_names = [(k, tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()]
    dtypes = {"BF16": torch.bfloat16, "F32": torch.float32, "I64": torch.int64}
    return module_names, [(n, s, dtypes[d]) for n, s, d in ckpt_names]


@pytest.fixture(scope="module")
def v3_names(tmp_path_factory):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(
        vocab_size=64, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        num_attention_heads=2, num_key_value_heads=2, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=16,
    )
    model = DeepseekV3ForCausalLM(cfg)
    path = tmp_path_factory.mktemp("v3")
    model.save_pretrained(path)
    with safe_open(path / "model.safetensors", "pt") as f:
        saved = [(k, tuple(f.get_slice(k).get_shape()), torch.float32) for k in f.keys()]
    return [(k, tuple(v.shape), v.dtype) for k, v in model.state_dict().items()], saved


def _check(names, patterns):
    wrong = [(n, decide(n, s, d)) for n, s, d in names if decide(n, s, d).quantise != _expected(n, patterns)]
    assert not wrong, wrong
    return sum(decide(n, s, d).quantise for n, s, d in names)


def test_dsv4_checkpoint_names(v4_names):
    _, ckpt = v4_names
    assert _check(ckpt, V4_CHECKPOINT_FP8) > 100
    # DeepSeek's own release has no "model." prefix (embed.weight, layers.0.attn.wq_a.weight, hc_head_fn)
    assert _check([(n.removeprefix("model."), s, d) for n, s, d in ckpt], V4_CHECKPOINT_FP8) > 100


def test_dsv4_module_names(v4_names):
    modules, _ = v4_names
    assert _check(modules, V4_MODULE_FP8) > 20


def test_dsv3_names(v3_names):
    modules, saved = v3_names
    assert _check(modules, V3_FP8) > 10
    assert _check(saved, V3_FP8) > 10


def test_every_kept_dsv4_tensor_has_its_specific_reason(v4_names):
    modules, ckpt = v4_names
    reasons = {n: decide(n, s, d).reason for n, s, d in ckpt + modules}
    expect = {
        "model.embed_tokens.weight": "embedding",
        "head.weight": "LM head",
        "lm_head.weight": "LM head",
        "model.layers.0.ffn.gate.weight": "router gate",
        "model.layers.1.ffn.gate.bias": "router bias",
        "model.layers.1.mlp.gate.e_score_correction_bias": "router bias",
        "model.layers.0.ffn.gate.tid2eid": "token-to-expert",
        "model.layers.1.attn.compressor.wkv.weight": "compressor",
        "model.layers.1.attn.compressor.wgate.weight": "compressor",
        "model.layers.1.attn.indexer.compressor.wkv.weight": "compressor",
        "model.layers.1.self_attn.compressor.indexer.gate_proj.weight": "compressor",
        "model.layers.1.attn.indexer.weights_proj.weight": "indexer scorer",
        "model.layers.1.self_attn.compressor.indexer.scorer.weights_proj.weight": "indexer scorer",
        "model.layers.0.hc_attn_fn": "mHC",
        "model.layers.0.attn_hc.fn": "mHC",
        "model.hc_head.hc_fn": "mHC",
        "model.layers.0.attn.attn_sink": "sink",
        "model.layers.0.self_attn.sinks": "sink",
        "model.layers.1.attn.compressor.ape": "position embedding",
        "model.layers.1.self_attn.compressor.position_bias": "position embedding",
        "model.layers.0.attn_norm.weight": "norm",
    }
    for name, fragment in expect.items():
        assert fragment in reasons[name], (name, reasons[name])
        assert not decide(name, (128, 128), torch.bfloat16).quantise  # kept whatever its shape


def test_structural_fallbacks():
    assert decide("x.proj.weight", (256, 512), torch.bfloat16).quantise
    assert not decide("x.proj.weight", (256,), torch.bfloat16).quantise  # 1-D
    assert not decide("x.proj.weight", (2, 3, 4), torch.bfloat16).quantise  # 3-D, not stacked experts
    assert not decide("x.proj.bias_matrix", (256, 512), torch.bfloat16).quantise  # 2-D but not .weight
    assert not decide("x.proj.weight", (256, 512), torch.int64).quantise
    assert scale_name("a.b.weight") == "a.b.weight_scale_inv"
    assert scale_name("mlp.experts.gate_up_proj") == "mlp.experts.gate_up_proj_scale_inv"
    assert scale_shape((8, 300, 129)) == (8, 3, 2)


def test_decision_table_lists_every_tensor(v4_names):
    _, ckpt = v4_names
    table = decision_table(ckpt)
    assert len(table) == len(ckpt) and set(table.action) == {"fp8", "keep"}
    assert table.reason.notna().all()
