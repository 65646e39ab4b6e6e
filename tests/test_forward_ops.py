"""The compiled rollout numerics and Sinkhorn loop (repro/fp8/kernels/forward_ops.c) give the torch ops' bits: on
hand-built tensors (ties, subnormals, zero groups, exponents at powers of two), on random ones, on the tiny
model's real generation and real hyper-connection inputs; and the torch ops run where the kernel declines."""

import pytest
import torch
from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection

import repro.fp8.forward_ops as forward_ops
import repro.fp8.fused as fused
from repro.model.hyper_connection import sinkhorn_entrywise
from repro.model.tiny import BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID, build_tiny_model
from repro.rollout.embedded import EmbeddedEngine
from repro.rollout.fp8_view import FP8WeightView
from repro.rollout.numerics import (
    RolloutNumerics, fake_quant_activation, kv_cache_round_trip, round_to_bf16, ue8m0_fp8_round_trip,
)
from repro.rollout.types import SamplingParams

pytestmark = pytest.mark.skipif(fused._compiler() is None, reason="no C compiler on this machine")


def _torch_ops(monkeypatch, fn, *args, **kwargs):
    """fn with the kernel switched off: the torch ops, the reference."""
    monkeypatch.setenv(forward_ops.DISABLE_ENV, "1")
    try:
        return fn(*args, **kwargs)
    finally:
        monkeypatch.delenv(forward_ops.DISABLE_ENV)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.int32), b.view(torch.int32))


def _activations(seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 5, 256, generator=g) * torch.logspace(-12, 3, 5).view(1, 5, 1)  # amax below eps .. large
    x[0, 0, :128] = 0  # an all-zero group: scale = eps / max
    x[1, 0, :128] = torch.tensor([448.0, 1.0, 0.5 + 2**-5, -0.5 - 2**-5] * 32)  # x / s on e4m3 rounding ties
    x[2, 0] = torch.randn(256, generator=g) * 1e-3
    x[2, 0, 0] = 1.0  # the rest of the group lands in e4m3's subnormals
    return x


@pytest.mark.parametrize("fmt,group", [("e4m3fn", 128), ("e4m3fnuz", 128), ("e4m3fn", 64), ("e4m3fn", 512)])
def test_fake_quant_matches_the_torch_ops(monkeypatch, fmt, group):
    x = _activations()
    fast = fake_quant_activation(x, group, fmt)
    assert forward_ops.fake_quant(x, min(group, 256), 448.0, 1e-10, False) is not None  # the kernel ran
    assert _same_bits(fast, _torch_ops(monkeypatch, fake_quant_activation, x, group, fmt))


def test_bf16_round_matches_the_torch_cast(monkeypatch):
    x = torch.cat([_activations(1).flatten(), torch.tensor([float("inf"), -float("inf"), 3.3895e38, 1 + 2**-8,
                                                           1 + 3 * 2**-8, -(1 + 2**-8), 1e-40, -0.0])])
    assert _same_bits(round_to_bf16(x), _torch_ops(monkeypatch, round_to_bf16, x))
    assert forward_ops.bf16_round(x) is not None
    nan = x.clone()
    nan[3] = float("nan")
    assert forward_ops.bf16_round(nan) is None  # torch's NaN bits depend on its vector width: the torch ops run
    assert _same_bits(round_to_bf16(nan), _torch_ops(monkeypatch, round_to_bf16, nan))


def _kv_entries(seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn(4, 7, 192, generator=g) * torch.logspace(-7, 4, 7).view(1, 7, 1)
    kv[0, 0, :64] = 0  # amax below the 1e-4 floor
    kv[0, 1, :64] = torch.linspace(-1, 1, 64) * 448 * 2.0**-3  # amax / 448 a power of two: exponent exact
    kv[0, 2, :64] = torch.linspace(-1, 1, 64) * 448 * 2.0**-3 * (1 + 2**-7)  # just above one
    return kv


def test_kv_round_trips_match_the_torch_ops(monkeypatch):
    kv = _kv_entries()
    assert _same_bits(kv_cache_round_trip(kv, 64), _torch_ops(monkeypatch, kv_cache_round_trip, kv, 64))
    assert _same_bits(ue8m0_fp8_round_trip(kv), _torch_ops(monkeypatch, ue8m0_fp8_round_trip, kv))
    assert _same_bits(ue8m0_fp8_round_trip(kv, 192), _torch_ops(monkeypatch, ue8m0_fp8_round_trip, kv, 192))
    assert forward_ops.kv_round_trip(kv, 64, 64, 1e-4, 448.0) is not None


def test_every_ue8m0_exponent_near_a_power_of_two_matches(monkeypatch):
    """Blocks whose amax / 448 is 2^k times 1, 1 + 1 ulp, 1 + 2 ulps, ... : where torch's fp32 log2 decides the
    exponent the kernel hands the call back to the torch ops; either way the bits are torch's."""
    rows = []
    for k in range(-20, 6):
        for ulps in (0, 1, 2, 3, 5, 17, 1000):
            amax = torch.tensor(448 * 2.0**k, dtype=torch.float32) * (1 + ulps * 2**-23)
            rows.append(torch.cat([amax.view(1), torch.linspace(-0.5, 0.5, 63) * amax]))
    x = torch.stack(rows)
    assert _same_bits(ue8m0_fp8_round_trip(x), _torch_ops(monkeypatch, ue8m0_fp8_round_trip, x))
    for row in x:  # row by row, so a declined row does not hide the others
        one = row.view(1, 64)
        assert _same_bits(ue8m0_fp8_round_trip(one), _torch_ops(monkeypatch, ue8m0_fp8_round_trip, one))


def test_non_finite_inputs_fall_back_to_the_torch_ops(monkeypatch):
    x = _activations(2)
    x[0, 0, 3] = float("inf")
    x[0, 1, 5] = float("nan")
    assert forward_ops.fake_quant(x, 128, 448.0, 1e-10, False) is None
    assert torch.equal(fake_quant_activation(x).isnan(), _torch_ops(monkeypatch, fake_quant_activation, x).isnan())
    kv = _kv_entries(1)
    kv[1, 1, 7] = float("inf")
    assert forward_ops.kv_round_trip(kv, 64, 64, 1e-4, 448.0) is None
    assert torch.equal(kv_cache_round_trip(kv, 64).isnan(),
                       _torch_ops(monkeypatch, kv_cache_round_trip, kv, 64).isnan())


@pytest.mark.parametrize("n", [2, 4])
def test_sinkhorn_matches_the_entrywise_ops(monkeypatch, n):
    g = torch.Generator().manual_seed(n)
    comb = torch.softmax(torch.randn(3, 17, n, n, generator=g) * 3, dim=-1) + 1e-6
    with torch.no_grad():
        fast = sinkhorn_entrywise(comb, 20, 1e-6)
        assert forward_ops.sinkhorn(comb, 20, 1e-6) is not None
        assert _same_bits(fast, _torch_ops(monkeypatch, sinkhorn_entrywise, comb, 20, 1e-6))
        assert _same_bits(sinkhorn_entrywise(comb, 1, 1e-6), _torch_ops(monkeypatch, sinkhorn_entrywise, comb, 1, 1e-6))
    leaf = comb.clone().requires_grad_()
    assert forward_ops.sinkhorn(leaf, 20, 1e-6) is None  # autograd: the no-grad kernel declines


@pytest.mark.parametrize("n,shape", [(2, (3, 17)), (4, (3, 17)), (4, (64, 18)), (4, (1, 1))])
def test_sinkhorn_backward_is_autograds_of_the_entrywise_ops(monkeypatch, n, shape):
    g = torch.Generator().manual_seed(n)
    logits, upstream = torch.randn(*shape, n, n, generator=g) * 3, torch.randn(*shape, n, n, generator=g)
    upstream[0, 0, 0, 0] = 0.0  # a zero gradient: autograd's ends as +0

    def run(fast: bool):
        x = logits.clone().requires_grad_()
        comb = torch.softmax(x, dim=-1) + 1e-6
        comb.retain_grad()
        out = (forward_ops.sinkhorn_with_grad(comb, 20, 1e-6) if fast
               else _torch_ops(monkeypatch, sinkhorn_entrywise, comb, 20, 1e-6))
        (out * upstream).sum().backward()
        return out.detach(), comb.grad, x.grad

    for a, b in zip(run(True), run(False)):
        assert _same_bits(a, b)


def test_tiny_model_generates_the_same_bits_with_the_kernels(monkeypatch):
    """Real tensors: the hyper-connections' inputs and every hook's, through a whole sampled generation."""
    model = build_tiny_model(0)
    prompts = [[BOS_TOKEN_ID, 5, 6, 7], [BOS_TOKEN_ID, 8, 9, 10, 11]]
    params = SamplingParams(n=3, max_new_tokens=6, seed=4, temperature=1.0)
    engine = EmbeddedEngine(model, EOS_TOKEN_ID, PAD_TOKEN_ID, 24, FP8WeightView(),
                            numerics=RolloutNumerics(True, 128, True, True))
    fast = engine.generate(prompts, params)
    for module in engine.model.modules():  # back to transformers' own hyper-connection: the code before the kernels
        if isinstance(module, DeepseekV4HyperConnection):
            module.__class__ = DeepseekV4HyperConnection
    slow = _torch_ops(monkeypatch, engine.generate, prompts, params)
    assert [t.response_ids for t in fast.trajectories] == [t.response_ids for t in slow.trajectories]
    for a, b in zip(fast.trajectories, slow.trajectories):
        assert _same_bits(a.logprobs, b.logprobs)


def test_tiny_model_training_gradients_are_the_same_bits_with_the_kernels(monkeypatch):
    """Real tensors under autograd: the trainer's model (entrywise hyper-connections), BF16 as the trainer runs it,
    one forward and backward with the Sinkhorn kernel and with the entrywise ops."""
    from repro.model.hyper_connection import use_entrywise_hyper_connections

    model = build_tiny_model(0).to(torch.bfloat16)
    for module in model.modules():  # the release keeps hyper-connections in FP32, as the trainer does
        if isinstance(module, DeepseekV4HyperConnection):
            module.float()
    assert use_entrywise_hyper_connections(model) > 0
    ids = torch.randint(3, 20, (4, 11), generator=torch.Generator().manual_seed(0))

    def grads():
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=ids).logits.float()
        torch.log_softmax(logits, dim=-1)[..., 5].sum().backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    calls = []
    original = forward_ops._Sinkhorn.backward
    monkeypatch.setattr(forward_ops._Sinkhorn, "backward",
                        staticmethod(lambda ctx, g: calls.append(1) or original(ctx, g)))
    fast, slow = grads(), _torch_ops(monkeypatch, grads)
    assert len(calls) == 2 * 4  # the kernel's backward ran: two hyper-connections in each of the 4 layers
    assert fast.keys() == slow.keys() and any("hc" in name or "hyper" in name for name in fast)
    for name in fast:
        assert torch.equal(fast[name].view(torch.int16 if fast[name].dtype == torch.bfloat16 else torch.int32),
                           slow[name].view(torch.int16 if slow[name].dtype == torch.bfloat16 else torch.int32)), name
