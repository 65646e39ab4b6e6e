"""Exact-number, edge-case, gradient and loop-equivalence tests for repro.algos.

Expected values are worked out by hand in the comments; float64 inputs keep them exact to ~1e-12.
"""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from repro.algos import (
    LOSS_AGG_MODES,
    ROLLOUT_IS_MODES,
    AlgoShapeError,
    agg_loss,
    broadcast_to_tokens,
    entropy_from_logits,
    grpo_advantages,
    logprobs_from_logits,
    ppo_clip_loss,
    response_token_mean,
    rollout_corr_metrics,
    rollout_is_weights,
)
from repro.errors import ReproError

from algo_values import LN2, D, t


# ---------------------------------------------------------------- advantages


def test_grpo_unbiased_std_two_of_four_correct():
    # mean 0.5; unbiased var = 4·0.25/3 = 1/3; std = 0.57735; (1 - 0.5)/0.57735 = 0.866025
    out = grpo_advantages(t([[1.0, 0.0, 0.0, 1.0]]))
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert torch.allclose(out.advantages, t([[expected, -expected, -expected, expected]]), atol=1e-12)
    assert abs(expected - 0.8660) < 1e-4
    assert out.num_zero_variance_groups == 0 and out.num_groups == 1


def test_dr_grpo_skips_std():
    out = grpo_advantages(t([[1.0, 0.0, 0.0, 1.0]]), norm_by_std=False)
    assert torch.equal(out.advantages, t([[0.5, -0.5, -0.5, 0.5]]))


def test_grpo_flat_scores_with_unsorted_group_ids():
    # group 7: [1, 3] mean 2, std √2 → ∓1/√2 ; group 3: [2, 6] mean 4, std √8 → ∓2/√8 = ∓1/√2
    out = grpo_advantages(t([1.0, 2.0, 3.0, 6.0]), torch.tensor([7, 3, 7, 3]), eps=0.0)
    r = 1 / math.sqrt(2)
    assert torch.allclose(out.advantages, t([-r, -r, r, r]), atol=1e-12)
    assert out.num_groups == 2


def test_all_equal_group_is_zero_and_counted():
    out = grpo_advantages(t([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))
    assert torch.equal(out.advantages[:2], torch.zeros(2, 3, dtype=D))
    assert not torch.isnan(out.advantages).any()
    assert out.num_zero_variance_groups == 2 and out.num_groups == 3


def test_singleton_group_follows_verl_mean0_std1():
    out = grpo_advantages(t([0.7, 1.0, 0.0]), torch.tensor([5, 9, 9]))
    assert out.advantages[0].item() == pytest.approx(0.7 / (1 + 1e-6), abs=1e-12)
    assert out.num_zero_variance_groups == 0


def test_advantage_shape_errors_name_the_arguments():
    with pytest.raises(AlgoShapeError, match="group_ids"):
        grpo_advantages(t([1.0, 0.0]))
    with pytest.raises(AlgoShapeError, match=r"scores \(2,\), group_ids \(3,\)"):
        grpo_advantages(t([1.0, 0.0]), torch.tensor([0, 0, 1]))
    with pytest.raises(ReproError):
        grpo_advantages(t([[1.0]]), torch.tensor([0]))


def test_broadcast_to_tokens_zeroes_padding():
    out = broadcast_to_tokens(t([2.0, -1.0]), torch.tensor([[1, 1, 0], [1, 0, 0]]))
    assert torch.equal(out, t([[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]))
    with pytest.raises(AlgoShapeError, match="advantages"):
        broadcast_to_tokens(t([1.0]), torch.ones(2, 3))


# ---------------------------------------------------------------- agg_loss

LOSS = t([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [5.0, 5.0, 5.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # row 3 fully masked


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 valid tokens
        ("seq-mean-token-mean", (1.5 + 4.0) / 2),  # row means 1.5 and 4; empty row 3 left out
        ("seq-mean-token-sum", (3.0 + 4.0) / 2),  # row sums 3 and 4
        ("seq-mean-token-sum-norm", 7 / 3),  # total 7 / T = 3
    ],
)
def test_agg_loss_modes_exact(mode, expected):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected, abs=1e-12)


def test_agg_loss_sum_norm_custom_length_and_errors():
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_length=4).item() == pytest.approx(1.75)
    with pytest.raises(AlgoShapeError, match="mode"):
        agg_loss(LOSS, MASK, "sum")  # type: ignore[arg-type]
    with pytest.raises(AlgoShapeError, match=r"loss_mat \(3, 3\), loss_mask \(3, 2\)"):
        agg_loss(LOSS, MASK[:, :2], "token-mean")


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_all_masked_is_zero_with_graph(mode):
    loss = torch.randn(2, 4, dtype=D, requires_grad=True)
    out = agg_loss(loss, torch.zeros(2, 4), mode)
    out.backward()
    assert out.item() == 0.0 and torch.equal(loss.grad, torch.zeros(2, 4, dtype=D))


# ---------------------------------------------------------------- PPO loss

# Tokens (logp_old = 0, so ratio r = exp(logp)), ε_low 0.2, ε_high 0.28, c = 3:
#  1 A=+1 r=1.5 → max(-1.5, -1.28) = -1.28           clip high, no gradient
#  2 A=+1 r=1.1 → -1.1                               gradient -r = -1.1
#  3 A=-1 r=0.5 → max(0.5, 0.8) = 0.8                clip low, no gradient
#  4 A=-1 r=4.0 → max(4, 1.28) = 4 → min(4, 3) = 3   dual-clip, no gradient
#  5 A=-1 r=2.0 → 2, below c                         gradient +r = 2
#  6 A=+1 r=0.5 → max(-0.5, -0.8) = -0.5             not clipped (A>0 only clips above), gradient -0.5
#  7 padding (r = e^5)                               0
RATIOS = [1.5, 1.1, 0.5, 4.0, 2.0, 0.5, math.exp(5)]
ADV = t([[1.0, 1.0, -1.0, -1.0, -1.0, 1.0, 1.0]])
PMASK = torch.tensor([[1, 1, 1, 1, 1, 1, 0]])


def _logp():
    return torch.log(t([RATIOS])).requires_grad_(True)


def test_ppo_clip_loss_exact_values_and_clipfracs():
    logp = _logp()
    out = ppo_clip_loss(logp, torch.zeros_like(logp), ADV, PMASK, clip_ratio_c=3.0)
    assert torch.allclose(out.loss_mat, t([[-1.28, -1.1, 0.8, 3.0, 2.0, -0.5, 0.0]]), atol=1e-12)
    assert out.pg_clipfrac.item() == pytest.approx(2 / 6)
    assert out.pg_clipfrac_high.item() == pytest.approx(1 / 6)
    assert out.pg_clipfrac_low.item() == pytest.approx(1 / 6)
    assert out.pg_clipfrac_lower.item() == pytest.approx(1 / 6)
    # ppo_kl = mean(-log r) = -ln(1.5·1.1·0.5·4·2·0.5)/6 = -ln(3.3)/6
    assert out.ppo_kl.item() == pytest.approx(-math.log(3.3) / 6)


def test_ppo_gradient_zero_for_clipped_tokens():
    logp = _logp()
    out = ppo_clip_loss(logp, torch.zeros_like(logp), ADV, PMASK, clip_ratio_c=3.0)
    out.loss_mat.sum().backward()
    # d(-A·r)/d logp = -A·r on unclipped tokens; exactly 0 where clipped, dual-clipped or padded
    assert torch.allclose(logp.grad, t([[0.0, -1.1, 0.0, 0.0, 2.0, -0.5, 0.0]]), atol=1e-12)


def test_ppo_without_dual_clip_and_with_is_weights():
    logp = _logp()
    out = ppo_clip_loss(logp, torch.zeros_like(logp), ADV, PMASK, clip_ratio_c=None)
    assert out.loss_mat[0, 3].item() == pytest.approx(4.0) and out.pg_clipfrac_lower.item() == 0.0
    # off is the default, as in LumenRL's GRPO loss (the AMD run): token 4 keeps its full loss and its gradient
    default = ppo_clip_loss(logp, torch.zeros_like(logp), ADV, PMASK)
    assert torch.equal(default.loss_mat, out.loss_mat) and default.pg_clipfrac_lower.item() == 0.0
    weights = t([[2.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0]]).requires_grad_(True)
    out = ppo_clip_loss(logp, torch.zeros_like(logp), ADV, PMASK, is_weights=weights)
    assert out.loss_mat[0, :2].tolist() == pytest.approx([-2.56, -0.55])
    out.loss_mat.sum().backward()
    assert weights.grad is None  # detached inside


def test_ppo_shape_and_dual_clip_errors():
    logp = _logp()
    with pytest.raises(AlgoShapeError, match=r"advantages \(1, 6\)"):
        ppo_clip_loss(logp, logp.detach(), ADV[:, :6], PMASK)
    with pytest.raises(AlgoShapeError, match="clip_ratio_c"):
        ppo_clip_loss(logp, logp.detach(), ADV, PMASK, clip_ratio_c=1.0)


# ---------------------------------------------------------------- logits


def test_logprobs_with_temperature_exact():
    logits = torch.log(t([[[1.0, 2.0, 3.0], [1.0, 1.0, 2.0]]]))
    ids = torch.tensor([[2, 0]])
    # T = 1: softmax(log p) = p/Σp → 3/6 and 1/4
    assert torch.allclose(logprobs_from_logits(logits, ids), torch.log(t([[0.5, 0.25]])).float())
    # T = 2: logits/2 = log √p → √3 / (1 + √2 + √3) and 1 / (2 + √2)
    expected = [math.sqrt(3) / (1 + math.sqrt(2) + math.sqrt(3)), 1 / (2 + math.sqrt(2))]
    got = logprobs_from_logits(logits, ids, temperature=2.0)
    assert torch.allclose(got, torch.log(t([expected])).float(), atol=1e-6)
    with pytest.raises(AlgoShapeError, match="token_ids"):
        logprobs_from_logits(logits, torch.tensor([[2]]))


def test_response_token_mean_weighs_tokens_not_rows():
    """LumenRL's entropy: Σ H·mask / Σ mask over the batch; a row of 1 token and a row of 3 weigh 1 : 3."""
    values = t([[9.0, 1.0, 0.0, 0.0], [2.0, 2.0, 5.0, 99.0]])
    mask = torch.tensor([[0, 1, 0, 0], [1, 1, 1, 0]])
    assert response_token_mean(values, mask) == pytest.approx((1 + 2 + 2 + 5) / 4, abs=1e-15)  # rows' means: 1, 3
    with pytest.raises(AlgoShapeError, match="no valid token"):
        response_token_mean(values, torch.zeros_like(mask))
    with pytest.raises(AlgoShapeError, match="shape mismatch"):
        response_token_mean(values, mask[:, :3])


def test_entropy_exact_stable_and_chunked():
    logits = torch.log(t([[[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]]]))
    p = [1 / 6, 2 / 6, 3 / 6]
    expected = [-sum(q * math.log(q) for q in p), math.log(3)]
    assert torch.allclose(entropy_from_logits(logits), t([expected]).float(), atol=1e-6)
    big = t([[[1e4, 0.0, 0.0], [-1e4, 1e4, 1e4]]])  # softmax saturates; naive p·log p gives NaN
    ent = entropy_from_logits(big)
    assert torch.isfinite(ent).all()
    assert ent[0, 0].item() == pytest.approx(0.0, abs=1e-6) and ent[0, 1].item() == pytest.approx(LN2, abs=1e-6)
    masked = t([[[0.0, 0.0, float("-inf")]]], dtype=torch.float32).requires_grad_(True)
    ent = entropy_from_logits(masked)  # vocabulary masking: two live tokens → ln 2, finite gradient
    ent.sum().backward()
    assert ent.item() == pytest.approx(LN2, abs=1e-6) and torch.isfinite(masked.grad).all()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 7, 11, generator=g)
    ref = torch.distributions.Categorical(logits=x / 0.7).entropy()
    assert torch.allclose(entropy_from_logits(x, temperature=0.7), ref, atol=1e-5)
    assert torch.allclose(entropy_from_logits(x, temperature=0.7, chunk_size=3), ref, atol=1e-5)


# ---------------------------------------------------------------- loop-vs-vectorised equivalence


def _random_batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    bsz, length = 6, 9
    lengths = torch.randint(0, length + 1, (bsz,), generator=g)
    lengths[0] = length  # at least one full row; other rows may be empty
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(torch.int64)
    logp_old = -torch.rand(bsz, length, generator=g, dtype=D) * 3
    logp_roll = logp_old + torch.randn(bsz, length, generator=g, dtype=D) * 0.6
    logp = logp_old + torch.randn(bsz, length, generator=g, dtype=D) * 0.3
    adv = torch.randn(bsz, generator=g, dtype=D)[:, None].expand(bsz, length).contiguous()
    return mask, logp_old, logp_roll, logp, adv


def _loop_token_loss(lp, lo, a, c_low=0.2, c_high=0.28, c=3.0, w=1.0):
    r = math.exp(max(-20.0, min(20.0, lp - lo)))
    loss = max(-a * r, -a * min(max(r, 1 - c_low), 1 + c_high))
    if a < 0:
        loss = min(loss, -a * c)
    return loss * w


def _loop_agg(rows: list[list[float]], mode: str, length: int) -> float:
    nonempty = [row for row in rows if row]
    if mode == "token-mean":
        flat = [x for row in rows for x in row]
        return sum(flat) / len(flat) if flat else 0.0
    if mode == "seq-mean-token-sum-norm":
        return sum(sum(row) for row in rows) / length
    per_seq = [sum(row) / len(row) if mode == "seq-mean-token-mean" else sum(row) for row in nonempty]
    return sum(per_seq) / len(per_seq) if per_seq else 0.0


def _loop_weight(mode, log_ratios_row, j, threshold=2.0):
    clamp = lambda x: max(-20.0, min(20.0, x))  # noqa: E731
    if mode == "none":
        return 1.0
    rho = math.exp(clamp(sum(log_ratios_row) if mode.startswith("sequence") else log_ratios_row[j]))
    if mode in ("token", "sequence"):
        return min(rho, threshold)
    return rho if 1 / threshold <= rho <= threshold else 0.0


@pytest.mark.parametrize("seed", range(5))
def test_loop_equivalence(seed):
    mask, logp_old, logp_roll, logp, adv = _random_batch(seed)
    bsz, length = mask.shape
    valid = [[j for j in range(length) if mask[i, j]] for i in range(bsz)]

    # advantages: groups of 3 with statistics.stdev (n - 1) as the reference
    scores = torch.randint(0, 3, (bsz,), generator=torch.Generator().manual_seed(seed)).to(D)
    ids = torch.tensor([i // 3 for i in range(bsz)])
    got = grpo_advantages(scores, ids).advantages
    for i in range(bsz):
        group = [scores[k].item() for k in range(bsz) if ids[k] == ids[i]]
        ref = (scores[i].item() - statistics.mean(group)) / (statistics.stdev(group) + 1e-6)
        assert got[i].item() == pytest.approx(ref, abs=1e-9)

    for is_mode in ROLLOUT_IS_MODES:
        weights = rollout_is_weights(logp_old, logp_roll, mask, is_mode).weights
        lr_rows = [[(logp_old[i, j] - logp_roll[i, j]).item() for j in valid[i]] for i in range(bsz)]
        for i in range(bsz):
            for k, j in enumerate(valid[i]):
                assert weights[i, j].item() == pytest.approx(_loop_weight(is_mode, lr_rows[i], k), rel=1e-9)
        assert weights[mask == 0].abs().sum().item() == 0.0

        loss_mat = ppo_clip_loss(logp, logp_old, adv, mask, clip_ratio_c=3.0, is_weights=weights).loss_mat
        rows = [
            [
                _loop_token_loss(logp[i, j].item(), logp_old[i, j].item(), adv[i, j].item(), w=weights[i, j].item())
                for j in valid[i]
            ]
            for i in range(bsz)
        ]
        for mode in LOSS_AGG_MODES:
            assert agg_loss(loss_mat, mask, mode).item() == pytest.approx(_loop_agg(rows, mode, length), abs=1e-9)

    m = rollout_corr_metrics(logp_old, logp_roll, mask, "token", verl=True)
    pairs = [(logp_old[i, j].item(), logp_roll[i, j].item()) for i in range(bsz) for j in valid[i]]
    rhos = [math.exp(o - r) for o, r in pairs]
    clamped = [min(max(w, 0.5), 2.0) for w in rhos]
    truncated = [min(w, 2.0) for w in rhos]
    seq_old = [statistics.mean(logp_old[i, j].item() for j in valid[i]) for i in range(bsz) if valid[i]]
    assert m["rollout_corr/kl"] == pytest.approx(statistics.mean(r - o for o, r in pairs), abs=1e-9)
    assert m["rollout_corr/k3_kl"] == pytest.approx(
        statistics.mean(w - (o - r) - 1 for w, (o, r) in zip(rhos, pairs)), abs=1e-9
    )
    assert m["rollout_corr/chi2_token"] == pytest.approx(statistics.mean(w * w for w in rhos) - 1, abs=1e-9)
    assert m["rollout_corr/training_ppl"] == pytest.approx(statistics.mean(math.exp(-s) for s in seq_old), abs=1e-9)
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(
        sum(w > 2.0 for w in rhos) / len(rhos)
    )
    assert m["rollout_corr_verl/rollout_is_eff_sample_size"] == pytest.approx(
        sum(clamped) ** 2 / (len(clamped) * sum(w * w for w in clamped)), abs=1e-9
    )
    assert m["rollout_corr_verl/rollout_is_std"] == pytest.approx(statistics.pstdev(clamped), abs=1e-9)
    # LumenRL's (the rollout_corr/ keys): statistics of the truncated weights, ESS of them clamped to [0, C]
    mean_t = statistics.mean(truncated)
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(mean_t, abs=1e-9)
    assert m["rollout_corr/rollout_is_max"] == pytest.approx(max(truncated), abs=1e-9)
    assert m["rollout_corr/rollout_is_std"] == pytest.approx(statistics.pstdev(truncated), abs=1e-9)
    assert m["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(
        1 / statistics.mean((w / (mean_t + 1e-8)) ** 2 for w in truncated), abs=1e-9
    )


def test_grpo_population_std_is_lumenrls():
    """LumenRL's GRPO (AMD's run): (r - mean) / max(population std, 1e-8). Group [1, -1, -1, -1]: mean -0.5,
    population std sqrt(3)/2, so 1.5 / (sqrt(3)/2) = sqrt(3) and -0.5 / (sqrt(3)/2) = -1/sqrt(3); verl's sample std
    (sqrt(1) = 1 over n - 1 = 3) gives 1.5/(1 + 1e-6) and -0.5/(1 + 1e-6)."""
    scores = t([[1.0, -1.0, -1.0, -1.0], [1.0, 1.0, 1.0, 1.0]])
    population = grpo_advantages(scores, std="population").advantages
    assert population[0].tolist() == pytest.approx([math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3),
                                                    -1 / math.sqrt(3)], abs=1e-12)
    assert population[1].tolist() == [0.0] * 4  # a zero-variance group: 0 / 1e-8
    sample = grpo_advantages(scores, std="sample").advantages
    assert sample[0].tolist() == pytest.approx([1.5 / (1 + 1e-6)] + [-0.5 / (1 + 1e-6)] * 3, abs=1e-12)
    with pytest.raises(AlgoShapeError, match="std must be"):
        grpo_advantages(scores, std="unbiased")
