"""repro.algos.sequence_mismatch, the per-trajectory numbers of the rollouts on disk: exact values on a hand-built
batch, and the batch metrics the run logs recovered from them as token-weighted means."""

from __future__ import annotations

import math

import pytest
import torch

from repro.algos import rollout_corr_metrics, sequence_mismatch

from algo_values import LN2, D, t

# Column 0 is a prompt position (mask 0) with a huge gap that must not count; row 1 ends in padding (log-ratio 1000),
# row 2 has no response token at all. Log-ratios lr = old - roll: row 0 [log .5, log 1.5, log 3], row 1
# [log 1.2, log 1.25].
ROLL = t([[-9.0, -1.0, -2.0, -0.5], [-9.0, -0.25, -1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
LR = t([[50.0, math.log(0.5), math.log(1.5), math.log(3.0)], [50.0, math.log(1.2), math.log(1.25), 1000.0],
        [50.0, 0.0, 0.0, 0.0]])
OLD = ROLL + LR
MASK = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0], [0, 0, 0, 0]], dtype=torch.bool)


def test_sequence_mismatch_exact():
    seq = sequence_mismatch(OLD, ROLL, MASK, threshold=2.0)
    assert seq.rollout_logprob_sum.tolist() == pytest.approx([-3.5, -1.25, 0.0], abs=1e-12)
    assert seq.trainer_logprob_sum.tolist() == pytest.approx([-3.5 + math.log(2.25), -1.25 + math.log(1.5), 0.0],
                                                             abs=1e-12)
    k3_row0 = ((0.5 + LN2 - 1) + (1.5 - math.log(1.5) - 1) + (3.0 - math.log(3.0) - 1)) / 3
    k3_row1 = ((1.2 - math.log(1.2) - 1) + (1.25 - math.log(1.25) - 1)) / 2
    assert seq.k3_kl.tolist() == pytest.approx([k3_row0, k3_row1, 0.0], abs=1e-12)
    assert seq.max_abs_gap.tolist() == pytest.approx([math.log(3.0), math.log(1.25), 0.0], abs=1e-12)
    assert seq.max_gap_position.tolist() == [2, 1, -1]  # inside the response: the prompt column is not counted
    assert seq.above_cap_share.tolist() == pytest.approx([1 / 3, 0.0, 0.0], abs=1e-12)  # ρ = 3 > C = 2
    assert sequence_mismatch(OLD, ROLL, MASK, threshold=1.4).above_cap_share.tolist() == pytest.approx([2 / 3, 0, 0])


def test_the_step_metrics_are_token_weighted_means_of_the_sequence_numbers():
    generator = torch.Generator().manual_seed(3)
    roll = -torch.rand(6, 9, generator=generator, dtype=D) * 3
    old = roll + torch.randn(6, 9, generator=generator, dtype=D) * 0.6
    mask = torch.rand(6, 9, generator=generator) < 0.7
    mask[:, 0] = True
    seq = sequence_mismatch(old, roll, mask, threshold=2.0)
    step = rollout_corr_metrics(old, roll, mask, mode="token", threshold=2.0)
    n = mask.sum(-1).double()
    assert float((seq.rollout_logprob_sum - seq.trainer_logprob_sum).sum() / n.sum()) == pytest.approx(
        step["rollout_corr/kl"], rel=1e-12)
    assert float((seq.k3_kl * n).sum() / n.sum()) == pytest.approx(step["rollout_corr/k3_kl"], rel=1e-12)
    high = float((seq.above_cap_share * n).sum() / n.sum())
    assert high == pytest.approx(step["rollout_corr/rollout_is_ratio_fraction_high"], rel=1e-12) and high > 0
    gaps = ((old - roll).abs() * mask).max(dim=-1).values
    assert torch.equal(seq.max_abs_gap, gaps)
