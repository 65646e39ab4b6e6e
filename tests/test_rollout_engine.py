"""Contract of a rollout engine, on the embedded CPU engine with a random tiny DeepSeek-V4."""

import pytest
import torch

from repro.algos import logprobs_from_logits
from repro.model.routing import RoutingReplay
from repro.model.tiny import BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID, build_tiny_model
from repro.rollout.embedded import EmbeddedEngine, RolloutError, sample_tokens
from repro.rollout.types import FinishReason, SamplingParams
from repro.train.batch import build_batch

PROMPTS = [[BOS_TOKEN_ID, 5, 10, 15, 4, 8, 17], [BOS_TOKEN_ID, 6, 6, 16, 4, 4, 17], [BOS_TOKEN_ID, 7, 17]]


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(seed=0)


@pytest.fixture(scope="module")
def engine(model):
    return EmbeddedEngine(model, EOS_TOKEN_ID, PAD_TOKEN_ID, max_context=32)


def test_prompt_major_order_and_determinism(engine):
    params = SamplingParams(n=3, max_new_tokens=6, seed=7)
    first = engine.generate(PROMPTS, params)
    assert [(t.prompt_index, t.sample_index) for t in first.trajectories] == \
        [(p, s) for p in range(3) for s in range(3)]
    assert [t.prompt_ids for t in first.trajectories[::3]] == PROMPTS
    again = engine.generate(PROMPTS, params)
    assert [t.response_ids for t in again.trajectories] == [t.response_ids for t in first.trajectories]
    other = engine.generate(PROMPTS, SamplingParams(n=3, max_new_tokens=6, seed=8))
    assert [t.response_ids for t in other.trajectories] != [t.response_ids for t in first.trajectories]
    assert first.generated_tokens == sum(len(t.response_ids) for t in first.trajectories)


def test_finish_reasons_and_lengths(engine):
    result = engine.generate(PROMPTS, SamplingParams(n=8, max_new_tokens=5, seed=0))
    for traj in result.trajectories:
        assert len(traj.logprobs) == len(traj.response_ids) <= 5
        if traj.finish_reason is FinishReason.EOS:
            assert traj.response_ids[-1] == EOS_TOKEN_ID and EOS_TOKEN_ID not in traj.response_ids[:-1]
        else:
            assert len(traj.response_ids) == 5 and EOS_TOKEN_ID not in traj.response_ids
        assert traj.weight_version == 0


def test_logprobs_and_routing_match_a_full_forward(model, engine):
    """The engine's per-token log-probs equal log_softmax(logits / T) of one full forward that replays the
    routing the engine recorded: cached decoding and routing capture are consistent (identity weight view)."""
    params = SamplingParams(n=4, max_new_tokens=8, temperature=0.8, seed=3)
    trajs = [t for t in engine.generate(PROMPTS[:2], params).trajectories]
    batch = build_batch(trajs, torch.zeros(len(trajs)), pad_id=PAD_TOKEN_ID)
    for traj in trajs:
        assert {k: tuple(v.shape) for k, v in traj.routing.items()} == \
            {1: (traj.num_tokens - 1, 2), 2: (traj.num_tokens - 1, 2), 3: (traj.num_tokens - 1, 2)}
    with torch.no_grad(), RoutingReplay(model, batch.routing):
        logits = model(input_ids=batch.input_ids).logits
    full = logprobs_from_logits(logits, batch.targets, temperature=0.8)
    diff = (full - batch.rollout_logprobs).abs()[batch.response_mask]
    assert diff.max() < 1e-4


def test_raw_logprobs_are_the_t1_distribution_and_the_samples_do_not_change(model, engine):
    """logprobs_mode raw (vLLM's default raw_logprobs, what AMD's run used): the same tokens as processed, each
    with its log_softmax(logits) at T = 1 from one full forward; at T = 0.8 that differs from the processed value."""
    params = SamplingParams(n=4, max_new_tokens=8, temperature=0.8, seed=3)
    processed = engine.generate(PROMPTS[:2], params).trajectories
    raw_engine = EmbeddedEngine(model, EOS_TOKEN_ID, PAD_TOKEN_ID, max_context=32, logprobs_mode="raw")
    raw = raw_engine.generate(PROMPTS[:2], params).trajectories
    assert [t.response_ids for t in raw] == [t.response_ids for t in processed]
    batch = build_batch(raw, torch.zeros(len(raw)), pad_id=PAD_TOKEN_ID)
    with torch.no_grad(), RoutingReplay(model, batch.routing):
        logits = model(input_ids=batch.input_ids).logits
    at_t1 = logprobs_from_logits(logits, batch.targets, temperature=1.0)
    assert (at_t1 - batch.rollout_logprobs).abs()[batch.response_mask].max() < 1e-4
    processed_batch = build_batch(processed, torch.zeros(len(processed)), pad_id=PAD_TOKEN_ID)
    gap = (processed_batch.rollout_logprobs - batch.rollout_logprobs).abs()[batch.response_mask]
    assert gap.max() > 1e-2
    with pytest.raises(RolloutError, match="logprobs_mode"):
        EmbeddedEngine(model, EOS_TOKEN_ID, PAD_TOKEN_ID, max_context=32, logprobs_mode="raw_logprobs")


def test_weight_update_changes_outputs_and_restore_brings_them_back(model):
    engine = EmbeddedEngine(model, EOS_TOKEN_ID, PAD_TOKEN_ID, max_context=32)
    params = SamplingParams(n=2, max_new_tokens=6, seed=1)
    before = engine.generate(PROMPTS, params)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    changed = dict(original)
    changed["lm_head.weight"] = original["lm_head.weight"] + 0.5 * torch.randn_like(original["lm_head.weight"])
    engine.update_weights(changed.items(), version=1)
    after = engine.generate(PROMPTS, params)
    assert engine.weight_version == 1 and after.trajectories[0].weight_version == 1
    assert not torch.equal(before.trajectories[0].logprobs[:1], after.trajectories[0].logprobs[:1])
    engine.update_weights(original.items(), version=2)
    restored = engine.generate(PROMPTS, params)
    assert all(torch.equal(a.logprobs, b.logprobs) for a, b in zip(before.trajectories, restored.trajectories))


def test_bad_weight_updates_are_refused_whole(model):
    engine = EmbeddedEngine(model, EOS_TOKEN_ID, PAD_TOKEN_ID, max_context=32)
    good = {k: v.clone() for k, v in model.state_dict().items()}
    missing = {k: v for k, v in good.items() if k != "model.norm.weight"}
    with pytest.raises(RolloutError, match=r"weight update v5: missing tensors \['model.norm.weight'\]"):
        engine.update_weights(missing.items(), version=5)
    shaped = dict(good, **{"lm_head.weight": torch.zeros(3, 3)})
    with pytest.raises(RolloutError, match=r"tensor lm_head.weight has shape \(3, 3\), the model's is \(25, 128\)"):
        engine.update_weights(shaped.items(), version=5)
    extra = dict(good, bogus=torch.zeros(1))
    with pytest.raises(RolloutError, match=r"unexpected tensors \['bogus'\]"):
        engine.update_weights(extra.items(), version=5)
    nan = dict(good, **{"lm_head.weight": torch.full_like(good["lm_head.weight"], float("nan"))})
    with pytest.raises(RolloutError, match="tensor lm_head.weight holds NaN or Inf"):
        engine.update_weights(nan.items(), version=5)
    assert engine.weight_version == 0
    assert torch.equal(engine.model.state_dict()["lm_head.weight"], good["lm_head.weight"])


def test_bad_requests(model, engine):
    params = SamplingParams(n=1, max_new_tokens=4)
    with pytest.raises(RolloutError, match="generate: prompt 1 is empty"):
        engine.generate([[BOS_TOKEN_ID, 5], []], params)
    with pytest.raises(RolloutError, match="generate: prompt 0 has 32 tokens, the context holds 32"):
        engine.generate([[5] * 32], params)
    with pytest.raises(RolloutError, match="generate: no prompts"):
        engine.generate([], params)
    poisoned = EmbeddedEngine(model, EOS_TOKEN_ID, PAD_TOKEN_ID, 32,
                              weight_view=lambda w: dict(w, **{"lm_head.weight": w["lm_head.weight"] * float("inf")}))
    with pytest.raises(RolloutError, match=r"non-finite log-probs at step 0 \(weights v0\)"):
        poisoned.generate(PROMPTS, params)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        SamplingParams(temperature=0.0)


def test_sampling_filters():
    logits = torch.tensor([[0.0, 1.0, 3.0, 2.0]]).repeat(500, 1)
    g = torch.Generator().manual_seed(0)
    tokens, logp = sample_tokens(logits, SamplingParams(n=1, top_p=0.01), g)
    assert set(tokens.tolist()) == {2}
    assert torch.allclose(logp, torch.log_softmax(logits / 0.8, dim=-1)[:, 2])
    tokens, _ = sample_tokens(logits, SamplingParams(n=1, top_k=2), g)
    assert set(tokens.tolist()) == {2, 3}
    tokens, _ = sample_tokens(logits, SamplingParams(n=1, top_p=0.75, temperature=1.0), g)
    # softmax of [0,1,3,2] = [.032,.087,.644,.237]: 0.644 < 0.75, so the nucleus is {2, 3}
    assert set(tokens.tolist()) == {2, 3}
