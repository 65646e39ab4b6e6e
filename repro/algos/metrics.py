"""Training–inference mismatch metrics under LumenRL's keys and definitions (AMD's run logged these), with verl's
variants of the IS statistics under names of their own.

Notation: over valid tokens, lr = log π_old - log π_rollout, ρ = exp(lr); per sequence b with n_b > 0 valid
tokens, m_old[b] = mean_t log π_old, m_roll[b] = mean_t log π_rollout. E_tok is the mean over all valid tokens
of the batch, E_seq the mean over sequences with n_b > 0. Sources: LumenRL 2232f55
``lumenrl/algorithms/rollout_correction.py`` (``compute_offpolicy_metrics``, ``compute_rollout_correction_weights``)
and ``lumenrl/trainer/rl_trainer.py`` (``_mismatch_by_response_position``); verl's ``rollout_corr_helper``.

Off-policy diagnostics (the same in LumenRL and verl):
  rollout_corr/kl                 E_tok[log π_rollout - log π_old]   (k1, direct estimator of KL(π_rollout‖π_old))
  rollout_corr/k3_kl              E_tok[ρ - lr - 1]                  (Schulman's k3 estimator)
  rollout_corr/chi2_token         E_tok[ρ²] - 1
  rollout_corr/chi2_seq           E_seq[(Π_t ρ_t)²] - 1
  rollout_corr/training_ppl       E_seq[exp(-m_old)]   — per-sequence perplexity, then the batch mean
  rollout_corr/training_log_ppl   E_seq[-m_old]
  rollout_corr/rollout_ppl        E_seq[exp(-m_roll)]
  rollout_corr/rollout_log_ppl    E_seq[-m_roll]
  rollout_corr/log_ppl_diff       E_seq[m_roll - m_old]; log_ppl_diff_max / _min: its extremes over sequences
  rollout_corr/log_ppl_abs_diff   E_seq[|m_roll - m_old|]
  rollout_corr/ppl_ratio          E_seq[exp(m_roll - m_old)]

IS-weight statistics, LumenRL's (absent for mode ``none``). w is the weight the loss uses (``rollout_is_weights``:
truncated at C, or zeroed where a ``*_mask`` mode rejects), per token; the raw weight is ρ (token modes) or Π_t ρ_t
(sequence modes):
  rollout_corr/rollout_is_mean            E_tok[w]
  rollout_corr/rollout_is_max|min         token modes: extremes of w over valid tokens (so max <= C);
                                          sequence modes: of the raw per-sequence weight (LumenRL reports them so)
  rollout_corr/rollout_is_ratio_fraction_high|low   share of tokens (sequences) whose raw weight is > C (< lower,
                                          lower = 1/C unless given): those the cap truncated, or that were rejected
  rollout_corr/rollout_is_std             population std of w over valid tokens (0 for a single token)
  rollout_corr/rollout_is_eff_sample_size 1 / E_tok[(w / (E_tok[w] + 1e-8))²]: the weights clamped to [0, C]
  rollout_corr/rollout_rs_masked_fraction ``*_mask`` modes only: share of valid tokens rejected
Per sequence (LumenRL's ``rollout_is_seq_*``): s_b = mean_t w over the sequence's valid tokens, r_b = mean_t of the
raw weight (ρ_t, or Π_t ρ_t broadcast), over the sequences with n_b > 0:
  rollout_corr/rollout_is_seq_mean|max|min     E_seq[s], max_b s_b, min_b s_b
  rollout_corr/rollout_is_seq_std              sample std of s (n - 1, as torch.std; 0 for one sequence)
  rollout_corr/rollout_is_seq_max_deviation    max_b |s_b - 1|
  rollout_corr/rollout_is_seq_fraction_high|low  share of sequences with r_b > C (< lower)

verl's variants (``verl_is_metrics``, logged under ``rollout_corr_verl/`` when the recipe asks): mean, max and min
of the raw weights (only the ±20 log clamp), std and ESS of the raw weights clamped to [lower, C]. For the same
weights the verl ESS is the higher one, since clamping from below at 1/C removes the small weights' spread.

By response position (LumenRL's buckets, ``repro.metric_keys.position_buckets``): for the valid tokens whose 0-based
position inside their response falls in [start, end), with δ = log π_rollout - log π_old:
  rollout_corr/pos_{start}_{end-1}/kl        E[δ]
  rollout_corr/pos_{start}_{end-1}/abs_diff  E[|δ|]
  rollout_corr/pos_{start}_{end-1}/k3_kl     E[exp(clamp(-δ, ±10)) + δ - 1]  (LumenRL clamps at 10 here, not 20)
  rollout_corr/pos_{start}_{end-1}/tokens    how many tokens; a bucket without tokens is not logged

Deviations, all only in degenerate inputs: sequences with no valid token are left out of E_seq and of the
sequence-level max/min/fractions; k3_kl clamps lr to ±20 before exp like the other metrics; no valid token at all
raises. Everything is computed in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from repro.algos.rollout_correction import (ROLLOUT_IS_MODES, SAFETY_BOUND, RolloutISMode, clamped_log_ratio,
                                            rollout_is_weights)
from repro.algos.shapes import AlgoShapeError, as_float_mask, require_rank, require_same_shape
from repro.metric_keys import position_buckets, position_key

PREFIX = "rollout_corr/"
VERL_PREFIX = "rollout_corr_verl/"
POSITION_K3_CLAMP = 10.0  # LumenRL's clamp of the log-ratio inside the per-position k3


def _tok_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum() / mask.sum())


def _std(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Population std over the valid tokens (0 for one token)."""
    if float(mask.sum()) <= 1:
        return 0.0
    mean = _tok_mean(values, mask)
    return math.sqrt(max(_tok_mean(values.square(), mask) - mean**2, 0.0))


def _checked(logp_old, logp_rollout, response_mask) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    require_rank("logp_old", logp_old, 2)
    require_same_shape(logp_old=logp_old, logp_rollout=logp_rollout, response_mask=response_mask)
    old = logp_old.detach().double()
    roll = logp_rollout.detach().double()
    mask = as_float_mask(response_mask, old)
    if mask.sum() == 0:
        raise AlgoShapeError(f"response_mask {tuple(response_mask.shape)} has no valid token")
    return old, roll, mask


def offpolicy_metrics(logp_old: torch.Tensor, logp_rollout: torch.Tensor,
                      response_mask: torch.Tensor) -> dict[str, float]:
    """k1/k3 KL, chi², perplexities of the batch, unprefixed keys (module docstring). Inputs [B, T]."""
    old, roll, mask = _checked(logp_old, logp_rollout, response_mask)
    lr = (old - roll) * mask
    lr_safe = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    rho = torch.exp(lr_safe)
    n_b = mask.sum(dim=-1)
    rows = n_b > 0
    seq_old = ((old * mask).sum(-1) / n_b.clamp(min=1))[rows]
    seq_roll = ((roll * mask).sum(-1) / n_b.clamp(min=1))[rows]
    seq_lr = lr.sum(-1)[rows]
    diff = seq_roll - seq_old
    return {
        "kl": _tok_mean(roll - old, mask),
        "k3_kl": _tok_mean(rho - lr_safe - 1.0, mask),
        "chi2_token": _tok_mean(rho.square(), mask) - 1.0,
        "chi2_seq": float(torch.exp(2.0 * seq_lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)).mean()) - 1.0,
        "training_ppl": float(torch.exp(-seq_old).mean()),
        "training_log_ppl": float((-seq_old).mean()),
        "rollout_ppl": float(torch.exp(-seq_roll).mean()),
        "rollout_log_ppl": float((-seq_roll).mean()),
        "log_ppl_diff": float(diff.mean()),
        "log_ppl_abs_diff": float(diff.abs().mean()),
        "log_ppl_diff_max": float(diff.max()),
        "log_ppl_diff_min": float(diff.min()),
        "ppl_ratio": float(torch.exp(diff).mean()),
    }


def _raw_unit_log_weights(old, roll, mask, level: str) -> torch.Tensor:
    """[N] log of the raw weight of each unit: each valid token (token level), or each non-empty sequence."""
    lr = (old - roll) * mask
    if level == "sequence":
        return lr.sum(-1)[mask.sum(-1) > 0]
    return lr[mask > 0]


def _weighting(logp_old, logp_rollout, response_mask, mode, threshold, threshold_lower):
    """Checked float64 inputs, the weights' level ("token"/"sequence") and the lower bound (1/C unless given)."""
    if mode not in ROLLOUT_IS_MODES:
        raise AlgoShapeError(f"mode must be one of {ROLLOUT_IS_MODES}, got {mode!r}")
    old, roll, mask = _checked(logp_old, logp_rollout, response_mask)
    level = "sequence" if mode.startswith("sequence") else "token"
    return old, roll, mask, level, 1.0 / threshold if threshold_lower is None else threshold_lower


def is_metrics(logp_old: torch.Tensor, logp_rollout: torch.Tensor, response_mask: torch.Tensor,
               mode: RolloutISMode = "token", threshold: float = 2.0,
               threshold_lower: float | None = None) -> dict[str, float]:
    """LumenRL's IS-weight statistics (module docstring), unprefixed keys; {} for mode ``none``. Inputs [B, T]."""
    if mode == "none":
        _checked(logp_old, logp_rollout, response_mask)
        return {}
    old, roll, mask, level, lower = _weighting(logp_old, logp_rollout, response_mask, mode, threshold, threshold_lower)
    weights = rollout_is_weights(old, roll, mask, mode, threshold, threshold_lower).weights
    unit_log_w = _raw_unit_log_weights(old, roll, mask, level)
    valid = mask > 0
    if level == "token":
        extremes = weights[valid]
    else:
        extremes = torch.exp(unit_log_w.clamp(max=SAFETY_BOUND))
    w = weights.clamp(0.0, threshold)
    w_norm = w / (_tok_mean(w, mask) + 1e-8)
    out = {
        "rollout_is_mean": _tok_mean(weights, mask),
        "rollout_is_max": float(extremes.max()),
        "rollout_is_min": float(extremes.min()),
        "rollout_is_ratio_fraction_high": float((unit_log_w > math.log(threshold)).double().mean()),
        "rollout_is_ratio_fraction_low": float((unit_log_w < math.log(lower)).double().mean()),
        "rollout_is_std": _std(w, mask),
        "rollout_is_eff_sample_size": 1.0 / _tok_mean(w_norm.square(), mask),
    }
    raw = torch.exp(clamped_log_ratio(old, roll, mask, level)) * mask
    if mode.endswith("_mask"):
        outside = (raw < lower) | (raw > threshold)
        out["rollout_rs_masked_fraction"] = _tok_mean(outside.double(), mask)
    out.update(_sequence_weight_metrics(weights, raw, mask, threshold, lower))
    return out


def _sequence_weight_metrics(weights: torch.Tensor, raw: torch.Tensor, mask: torch.Tensor, threshold: float,
                             lower: float) -> dict[str, float]:
    """LumenRL's ``rollout_is_seq_*`` (module docstring) from [B, T] used weights, raw weights and float mask."""
    n_b = mask.sum(-1)
    rows = n_b > 0
    seq_w = ((weights * mask).sum(-1) / n_b.clamp(min=1))[rows]
    seq_raw = ((raw * mask).sum(-1) / n_b.clamp(min=1))[rows]
    return {
        "rollout_is_seq_mean": float(seq_w.mean()),
        "rollout_is_seq_std": float(seq_w.std()) if seq_w.numel() > 1 else 0.0,
        "rollout_is_seq_max": float(seq_w.max()),
        "rollout_is_seq_min": float(seq_w.min()),
        "rollout_is_seq_max_deviation": float((seq_w - 1.0).abs().max()),
        "rollout_is_seq_fraction_high": float((seq_raw > threshold).double().mean()),
        "rollout_is_seq_fraction_low": float((seq_raw < lower).double().mean()),
    }


def verl_is_metrics(logp_old: torch.Tensor, logp_rollout: torch.Tensor, response_mask: torch.Tensor,
                    mode: RolloutISMode = "token", threshold: float = 2.0,
                    threshold_lower: float | None = None) -> dict[str, float]:
    """verl's IS-weight statistics (raw weights; std and ESS of the weights clamped to [lower, C]), unprefixed
    keys; {} for mode ``none``. Inputs [B, T]."""
    if mode == "none":
        _checked(logp_old, logp_rollout, response_mask)
        return {}
    old, roll, mask, level, lower = _weighting(logp_old, logp_rollout, response_mask, mode, threshold, threshold_lower)
    w_tok = torch.exp(clamped_log_ratio(old, roll, mask, level))
    unit_log_w = _raw_unit_log_weights(old, roll, mask, level)
    unit_w = torch.exp(unit_log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    w_clamped = w_tok.clamp(lower, threshold)
    sum_w = float((w_clamped * mask).sum())
    sum_w2 = float((w_clamped.square() * mask).sum())
    return {
        "rollout_is_mean": _tok_mean(w_tok, mask),
        "rollout_is_max": float(unit_w.max()),
        "rollout_is_min": float(unit_w.min()),
        "rollout_is_std": _std(w_clamped, mask),
        "rollout_is_eff_sample_size": sum_w**2 / (float(mask.sum()) * sum_w2),
    }


def position_metrics(logp_old: torch.Tensor, logp_rollout: torch.Tensor,
                     response_mask: torch.Tensor) -> dict[str, float]:
    """Mismatch by response position in LumenRL's buckets, full ``rollout_corr/pos_*`` keys (module docstring).
    Inputs [B, T]; a token's position is its 0-based index among its row's valid tokens."""
    old, roll, mask = _checked(logp_old, logp_rollout, response_mask)
    valid = mask > 0
    positions = valid.long().cumsum(dim=-1) - 1
    delta = roll - old
    k3 = torch.exp((-delta).clamp(-POSITION_K3_CLAMP, POSITION_K3_CLAMP)) + delta - 1.0
    out: dict[str, float] = {}
    for start, end in position_buckets():
        selected = valid & (positions >= start) & (positions < end)
        tokens = int(selected.sum())
        if tokens == 0:
            continue
        out[position_key(start, end, "tokens")] = float(tokens)
        out[position_key(start, end, "kl")] = float(delta[selected].mean())
        out[position_key(start, end, "abs_diff")] = float(delta[selected].abs().mean())
        out[position_key(start, end, "k3_kl")] = float(k3[selected].mean())
    return out


@dataclass(frozen=True)
class SequenceMismatch:
    """The mismatch of each sequence of a batch, [B] each (float64 unless said); a row with no valid token has
    zero sums, gap and shares and position -1."""

    rollout_logprob_sum: torch.Tensor  # Σ_t log π_rollout
    trainer_logprob_sum: torch.Tensor  # Σ_t log π_old
    k3_kl: torch.Tensor                # mean_t of ρ - lr - 1 (lr clamped to ±20, as k3_kl above)
    max_abs_gap: torch.Tensor          # max_t |log π_old - log π_rollout|
    max_gap_position: torch.Tensor     # int64: 0-based position inside the response of that token
    above_cap_share: torch.Tensor      # share of the row's tokens whose ρ exceeds the cap C (truncated by TIS)


@torch.no_grad()
def sequence_mismatch(logp_old: torch.Tensor, logp_rollout: torch.Tensor, response_mask: torch.Tensor,
                      threshold: float = 2.0) -> SequenceMismatch:
    """Per-sequence mismatch of [B, T] inputs; the batch's ``kl``, ``k3_kl`` and ``rollout_is_ratio_fraction_high``
    (token modes) are the token-weighted means of (rollout - trainer sum) / n_b, ``k3_kl`` and ``above_cap_share``."""
    old, roll, mask = _checked(logp_old, logp_rollout, response_mask)
    valid = mask > 0
    n_b = mask.sum(-1)
    lr = (old - roll) * mask
    lr_safe = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    k3 = (torch.exp(lr_safe) - lr_safe - 1.0) * mask
    gap = lr.abs().masked_fill(~valid, -1.0)
    column = gap.argmax(dim=-1)
    position = (valid.long().cumsum(dim=-1) - 1).gather(-1, column[:, None]).squeeze(-1)
    has_tokens = n_b > 0
    return SequenceMismatch(
        rollout_logprob_sum=(roll * mask).sum(-1),
        trainer_logprob_sum=(old * mask).sum(-1),
        k3_kl=k3.sum(-1) / n_b.clamp(min=1),
        max_abs_gap=gap.max(dim=-1).values.clamp(min=0.0),
        max_gap_position=torch.where(has_tokens, position, torch.full_like(position, -1)),
        above_cap_share=((lr > math.log(threshold)) & valid).double().sum(-1) / n_b.clamp(min=1),
    )


@torch.no_grad()
def rollout_corr_metrics(
    logp_old: torch.Tensor,
    logp_rollout: torch.Tensor,
    response_mask: torch.Tensor,
    mode: RolloutISMode = "token",
    threshold: float = 2.0,
    threshold_lower: float | None = None,
    verl: bool = False,
) -> dict[str, float]:
    """Every mismatch metric of the batch as a run logs it: off-policy diagnostics and LumenRL's IS statistics
    under ``rollout_corr/``, the per-position buckets, and with ``verl`` verl's IS statistics under
    ``rollout_corr_verl/``.

    Args:
        logp_old: [B, T] trainer log-probs. logp_rollout: [B, T] rollout-engine log-probs.
        response_mask: [B, T] bool/0-1 with at least one valid token.
        mode, threshold, threshold_lower: as passed to ``rollout_is_weights``.
    Returns:
        dict of python floats.
    """
    args = (logp_old, logp_rollout, response_mask)
    out = {PREFIX + k: v for k, v in offpolicy_metrics(*args).items()}
    out.update({PREFIX + k: v for k, v in is_metrics(*args, mode, threshold, threshold_lower).items()})
    out.update(position_metrics(*args))
    if verl:
        out.update({VERL_PREFIX + k: v for k, v in verl_is_metrics(*args, mode, threshold, threshold_lower).items()})
    return out
