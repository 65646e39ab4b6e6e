"""Exact-number tests for the rollout-correction math in repro.algos: truncated IS weights (token, sequence,
mask modes) and the off-policy metrics (k1/k3 KL, chi2, ESS), split from test_algos.py by subject.

Expected values are worked out by hand in the comments; float64 inputs keep them exact to ~1e-12.
"""

from __future__ import annotations

import math

import pytest
import torch

from repro.algos import (
    ROLLOUT_IS_MODES,
    AlgoShapeError,
    position_metrics,
    ppo_clip_loss,
    rollout_corr_metrics,
    rollout_is_weights,
)

from algo_values import LN2, D, t


# ---------------------------------------------------------------- rollout IS weights

# ρ = π_old/π_rollout: row 1 [0.5, 1.5, 3.0] (product 2.25); row 2 [1.2, 1.25] (product 1.5) + padding whose
# log-ratio is 1000: if padding leaked into the sequence sum the row-2 weight would blow up.
OLD = torch.log(t([[0.5, 1.5, 3.0], [1.2, 1.25, 1.0]]))
OLD[1, 2] = 1000.0
ROLL = torch.zeros(2, 3, dtype=D)
WMASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


@pytest.mark.parametrize(
    "mode, weights, truncated",
    [
        ("token", [[0.5, 1.5, 2.0], [1.2, 1.25, 0.0]], [[0, 0, 1], [0, 0, 0]]),  # 3.0 capped at 2
        ("sequence", [[2.0, 2.0, 2.0], [1.5, 1.5, 0.0]], [[1, 1, 1], [0, 0, 0]]),  # 2.25 capped at 2
        ("token_mask", [[0.5, 1.5, 0.0], [1.2, 1.25, 0.0]], [[0, 0, 1], [0, 0, 0]]),  # 0.5 = lower is kept
        ("sequence_mask", [[0.0, 0.0, 0.0], [1.5, 1.5, 0.0]], [[1, 1, 1], [0, 0, 0]]),  # 2.25 > 2 rejected
        ("none", [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], [[0, 0, 0], [0, 0, 0]]),
    ],
)
def test_rollout_is_weights_each_mode(mode, weights, truncated):
    out = rollout_is_weights(OLD, ROLL, WMASK, mode, threshold=2.0)
    assert torch.allclose(out.weights, t(weights), atol=1e-12)
    assert torch.equal(out.truncated_mask, torch.tensor(truncated, dtype=torch.bool))
    expected_keep = WMASK.bool() & ~out.truncated_mask if mode.endswith("_mask") else WMASK.bool()
    assert torch.equal(out.keep_mask, expected_keep)


def test_rollout_is_overflow_is_finite():
    # log-ratio ±1000 would overflow exp(); the ±20 clamp keeps ρ in [e^-20, e^20]
    old = t([[1000.0, -1000.0, 0.0]])
    roll = torch.zeros(1, 3, dtype=D)
    mask = torch.ones(1, 3)
    for mode in ROLLOUT_IS_MODES:
        out = rollout_is_weights(old.float(), roll.float(), mask, mode)
        assert torch.isfinite(out.weights).all()
    assert rollout_is_weights(old, roll, mask, "token").weights.tolist() == [[2.0, math.exp(-20), 1.0]]
    metrics = rollout_corr_metrics(old.float(), roll.float(), mask, "token", verl=True)
    assert all(math.isfinite(v) for v in metrics.values())
    assert metrics["rollout_corr_verl/rollout_is_max"] == pytest.approx(math.exp(20), rel=1e-5)  # raw weight
    assert metrics["rollout_corr/rollout_is_max"] == 2.0  # LumenRL's: the truncated weight


def test_rollout_is_weights_are_detached():
    roll = torch.zeros(2, 3, dtype=D, requires_grad=True)
    old = OLD.clone().requires_grad_(True)
    out = rollout_is_weights(old, roll, WMASK, "token")
    assert not out.weights.requires_grad
    # decoupled use: IS weights into the PPO loss; d loss / d logp_rollout must vanish
    logp = torch.zeros(2, 3, dtype=D, requires_grad=True)
    raw_w = torch.exp(old - roll).clamp(max=2.0)  # even a caller forgetting to detach gets no gradient
    loss = ppo_clip_loss(logp, old, torch.ones(2, 3, dtype=D), WMASK, is_weights=raw_w).loss_mat.sum()
    loss.backward()
    assert roll.grad is None and old.grad is None and logp.grad is not None


def test_rollout_is_errors():
    with pytest.raises(AlgoShapeError, match="mode"):
        rollout_is_weights(OLD, ROLL, WMASK, "geometric")  # type: ignore[arg-type]
    with pytest.raises(AlgoShapeError, match=r"logp_rollout \(2, 2\)"):
        rollout_is_weights(OLD, ROLL[:, :2], WMASK)


# ---------------------------------------------------------------- metrics

# Valid tokens: row 1 π_old [0.5, 0.25], π_rollout [0.125, 0.5]; row 2 π_old [0.2], π_rollout [0.8].
# ρ = [4, 0.5, 0.25], log ρ = [2 ln2, -ln2, -2 ln2]. Padding (row 2, col 2) holds garbage that must not count.
M_OLD = torch.log(t([[0.5, 0.25], [0.2, 1e-9]]))
M_ROLL = torch.log(t([[0.125, 0.5], [0.8, 0.9]]))
M_MASK = torch.tensor([[1, 1], [1, 0]])


def test_offpolicy_metrics_exact():
    m = rollout_corr_metrics(M_OLD, M_ROLL, M_MASK, "none")
    expected = {
        "kl": LN2 / 3,  # mean(-log ρ) = (-2 + 1 + 2) ln2 / 3
        "k3_kl": (1.75 + LN2) / 3,  # Σ(ρ - log ρ - 1) = (4 + .5 + .25 - 3) + (-2 + 1 + 2) ln2
        "chi2_token": (16 + 0.25 + 0.0625) / 3 - 1,  # E[ρ²] - 1 = 4.4375
        "chi2_seq": (4 + 0.0625) / 2 - 1,  # row products 2 and 0.25, squared
        "training_ppl": (2**1.5 + 5) / 2,  # per-row exp(-mean log π_old): 2^1.5 and 1/0.2, then mean
        "training_log_ppl": (1.5 * LN2 + math.log(5)) / 2,
        "rollout_ppl": (4 + 1.25) / 2,  # 1/√(0.125·0.5) = 4 and 1/0.8
        "rollout_log_ppl": (2 * LN2 + math.log(1.25)) / 2,
        "log_ppl_diff": (-0.5 * LN2 + 2 * LN2) / 2,  # per row m_roll - m_old: -0.5 ln2 and ln4
        "log_ppl_abs_diff": (0.5 * LN2 + 2 * LN2) / 2,
        "log_ppl_diff_max": 2 * LN2,
        "log_ppl_diff_min": -0.5 * LN2,
        "ppl_ratio": (2**-0.5 + 4) / 2,
    }
    # every token sits at position 0 or 1: only LumenRL's first bucket is logged, over all three tokens
    # (δ = log π_rollout - log π_old = [-2 ln2, ln2, 2 ln2])
    by_position = {
        "rollout_corr/pos_0_127/tokens": 3.0,
        "rollout_corr/pos_0_127/kl": LN2 / 3,
        "rollout_corr/pos_0_127/abs_diff": 5 * LN2 / 3,
        "rollout_corr/pos_0_127/k3_kl": (1.75 + LN2) / 3,  # |log ρ| <= 10: the bucket's clamp does not bite
    }
    assert set(m) == {"rollout_corr/" + k for k in expected} | set(by_position)
    for key, value in expected.items():
        assert m["rollout_corr/" + key] == pytest.approx(value, abs=1e-9), key
    for key, value in by_position.items():
        assert m[key] == pytest.approx(value, abs=1e-12), key


def test_is_metrics_token_level_exact_verl():
    m = rollout_corr_metrics(M_OLD, M_ROLL, M_MASK, "token", threshold=2.0, verl=True)
    # pre-truncation w = [4, .5, .25]; clamp to [1/2, 2] → [2, .5, .5] for std / ESS
    assert m["rollout_corr_verl/rollout_is_mean"] == pytest.approx(4.75 / 3)
    assert m["rollout_corr_verl/rollout_is_max"] == pytest.approx(4.0)
    assert m["rollout_corr_verl/rollout_is_min"] == pytest.approx(0.25)
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3)
    assert m["rollout_corr/rollout_is_ratio_fraction_low"] == pytest.approx(1 / 3)
    assert m["rollout_corr_verl/rollout_is_std"] == pytest.approx(math.sqrt(1.5 - 1.0))  # E[w²] = 4.5/3, E[w] = 1
    assert m["rollout_corr_verl/rollout_is_eff_sample_size"] == pytest.approx(3.0**2 / (3 * 4.5))  # = 2/3
    assert "rollout_corr/rollout_rs_masked_fraction" not in m
    assert not any(k.startswith("rollout_corr_verl/") for k in rollout_corr_metrics(M_OLD, M_ROLL, M_MASK, "token"))


def test_is_metrics_token_level_exact_lumenrl():
    """LumenRL's definitions (AMD's run): statistics of the truncated weights, ESS on them clamped to [0, C]."""
    m = rollout_corr_metrics(M_OLD, M_ROLL, M_MASK, "token", threshold=2.0)
    # raw w = [4, .5, .25] -> truncated [2, .5, .25]: E[w] = 2.75/3, E[w²] = 4.3125/3
    mean, second = 2.75 / 3, 4.3125 / 3
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(mean, abs=1e-12)
    assert m["rollout_corr/rollout_is_max"] == pytest.approx(2.0, abs=1e-12)
    assert m["rollout_corr/rollout_is_min"] == pytest.approx(0.25, abs=1e-12)
    assert m["rollout_corr/rollout_is_std"] == pytest.approx(math.sqrt(second - mean**2), abs=1e-12)
    # 1 / E[(w / (E w + 1e-8))²] = (E w + 1e-8)² / E[w²] = 0.58454..., below verl's 2/3 for the same tokens
    assert m["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx((mean + 1e-8) ** 2 / second, abs=1e-12)
    assert m["rollout_corr/rollout_is_eff_sample_size"] < 2 / 3


def test_is_metrics_sequence_level_exact():
    m = rollout_corr_metrics(M_OLD, M_ROLL, M_MASK, "sequence", threshold=1.5, verl=True)
    # per-row w = [2, 0.25], per token [2, 2, .25]; verl clamps to [2/3, 1.5] → [1.5, 1.5, 2/3]
    clamped = [1.5, 1.5, 2 / 3]
    mean_c = sum(clamped) / 3
    assert m["rollout_corr_verl/rollout_is_mean"] == pytest.approx(4.25 / 3)
    assert m["rollout_corr_verl/rollout_is_max"] == pytest.approx(2.0)
    assert m["rollout_corr_verl/rollout_is_min"] == pytest.approx(0.25)
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(0.5)
    assert m["rollout_corr/rollout_is_ratio_fraction_low"] == pytest.approx(0.5)
    assert m["rollout_corr_verl/rollout_is_std"] == pytest.approx(
        math.sqrt(sum(w * w for w in clamped) / 3 - mean_c**2)
    )
    assert m["rollout_corr_verl/rollout_is_eff_sample_size"] == pytest.approx(
        sum(clamped) ** 2 / (3 * sum(w * w for w in clamped))
    )
    # LumenRL: the loss's weights are the truncated [1.5, 1.5, .25]; max/min of the raw per-sequence weight
    truncated = [1.5, 1.5, 0.25]
    mean_t, second_t = sum(truncated) / 3, sum(w * w for w in truncated) / 3
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(mean_t, abs=1e-12)
    assert m["rollout_corr/rollout_is_max"] == pytest.approx(2.0, abs=1e-12)
    assert m["rollout_corr/rollout_is_min"] == pytest.approx(0.25, abs=1e-12)
    assert m["rollout_corr/rollout_is_std"] == pytest.approx(math.sqrt(second_t - mean_t**2), abs=1e-12)
    assert m["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx((mean_t + 1e-8) ** 2 / second_t, abs=1e-12)


@pytest.mark.parametrize(
    "mode, threshold, expected",
    [
        # token, C = 2: raw ρ row 0 [4, .5] -> truncated [2, .5], s_0 = 1.25, r_0 = 2.25 > 2; row 1 [.25]: s_1 = .25,
        # r_1 = .25 < 1/2. Sample std of [1.25, .25] (n - 1 = 1): sqrt(.5**2 + .5**2)
        ("token", 2.0, {"mean": 0.75, "std": math.sqrt(0.5), "max": 1.25, "min": 0.25, "max_deviation": 0.75,
                        "fraction_high": 0.5, "fraction_low": 0.5}),
        # sequence, C = 1.5: raw products [2, .25] -> [1.5, .25] on every token of the row; lower = 2/3
        ("sequence", 1.5, {"mean": 0.875, "std": 0.625 * math.sqrt(2), "max": 1.5, "min": 0.25,
                           "max_deviation": 0.75, "fraction_high": 0.5, "fraction_low": 0.5}),
    ],
)
def test_is_metrics_per_sequence_exact(mode, threshold, expected):
    """LumenRL's rollout_is_seq_*: per-sequence mean of the used weights s_b, and of the raw weights r_b."""
    m = rollout_corr_metrics(M_OLD, M_ROLL, M_MASK, mode, threshold=threshold)
    got = {k.removeprefix("rollout_corr/rollout_is_seq_"): v for k, v in m.items() if "rollout_is_seq_" in k}
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-12), key
    one_row = rollout_corr_metrics(M_OLD[:1], M_ROLL[:1], M_MASK[:1], mode, threshold=threshold)
    assert one_row["rollout_corr/rollout_is_seq_std"] == 0.0  # LumenRL's guard: one sequence has no spread


def test_mismatch_by_position_uses_lumenrls_buckets_and_k3_clamp():
    """Positions count a row's valid tokens; bucket edges 128/512/1024/2048/4096; a token past 4,095 is in none;
    the per-bucket k3 clamps log ρ at ±10 (LumenRL's), so a token with log ρ = 12 adds e^10 - 12 - 1."""
    length = 4100
    mask = torch.zeros(2, length + 2, dtype=torch.int64)
    mask[0, 2:2 + length] = 1   # row 0: a response of 4,100 tokens after 2 prompt/padding columns
    mask[1, 0:3] = 1            # row 1: 3 tokens
    old = torch.zeros(2, length + 2, dtype=D)
    roll = torch.zeros(2, length + 2, dtype=D)
    roll[0, 2 + 200] = -12.0    # row 0, position 200: log ρ = 12 (bucket 128-511)
    roll[0, 2 + 4099] = -5.0    # position 4,099: in no bucket
    roll[1, 1] = 0.5            # row 1, position 1: δ = 0.5 (bucket 0-127)
    m = position_metrics(old, roll, mask)
    assert m["rollout_corr/pos_0_127/tokens"] == 128 + 3
    assert m["rollout_corr/pos_0_127/kl"] == pytest.approx(0.5 / 131, abs=1e-15)
    assert m["rollout_corr/pos_0_127/abs_diff"] == pytest.approx(0.5 / 131, abs=1e-15)
    assert m["rollout_corr/pos_0_127/k3_kl"] == pytest.approx((math.exp(-0.5) + 0.5 - 1) / 131, abs=1e-15)
    assert m["rollout_corr/pos_128_511/tokens"] == 384
    assert m["rollout_corr/pos_128_511/kl"] == pytest.approx(-12 / 384, abs=1e-15)
    assert m["rollout_corr/pos_128_511/k3_kl"] == pytest.approx((math.exp(10) - 12 - 1) / 384, abs=1e-12)
    assert [m[f"rollout_corr/pos_{a}_{b}/tokens"] for a, b in ((512, 1023), (1024, 2047), (2048, 4095))] == [
        512, 1024, 2048]
    assert m["rollout_corr/pos_2048_4095/kl"] == 0.0  # the -5 at position 4,099 counts nowhere
    short = position_metrics(old[1:, :3], roll[1:, :3], mask[1:, :3])
    assert set(short) == {f"rollout_corr/pos_0_127/{s}" for s in ("tokens", "kl", "abs_diff", "k3_kl")}


def test_mask_mode_reports_rejected_fraction():
    m = rollout_corr_metrics(M_OLD, M_ROLL, M_MASK, "token_mask", threshold=2.0, threshold_lower=0.4)
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 3)  # 4 and 0.25 outside [.4, 2]


def test_metrics_reject_empty_mask():
    with pytest.raises(AlgoShapeError, match="response_mask"):
        rollout_corr_metrics(M_OLD, M_ROLL, torch.zeros(2, 2))


