"""Training–inference mismatch metrics, keyed and defined as verl's ``rollout_corr_helper`` logs them
(``compute_offpolicy_metrics`` and ``compute_is_metrics``), so our curves sit next to AMD's / LumenRL's.

Notation: over valid tokens, lr = log π_old - log π_rollout, ρ = exp(lr); per sequence b with n_b > 0 valid
tokens, m_old[b] = mean_t log π_old, m_roll[b] = mean_t log π_rollout. E_tok is the mean over all valid tokens
of the batch, E_seq the mean over sequences with n_b > 0.

  rollout_corr/kl                 E_tok[log π_rollout - log π_old]   (direct estimator of KL(π_rollout‖π_old))
  rollout_corr/k3_kl              E_tok[ρ - lr - 1]                  (Schulman's k3 estimator)
  rollout_corr/chi2_token         E_tok[ρ²] - 1
  rollout_corr/chi2_seq           E_seq[(Π_t ρ_t)²] - 1
  rollout_corr/training_ppl       E_seq[exp(-m_old)]   — per-sequence perplexity, then the batch mean (verl)
  rollout_corr/training_log_ppl   E_seq[-m_old]
  rollout_corr/rollout_ppl        E_seq[exp(-m_roll)]
  rollout_corr/rollout_log_ppl    E_seq[-m_roll]
  rollout_corr/log_ppl_diff       E_seq[m_roll - m_old]   (= log of the per-sequence training/rollout ppl ratio)
  rollout_corr/log_ppl_abs_diff   E_seq[|m_roll - m_old|]
  rollout_corr/ppl_ratio          E_seq[exp(m_roll - m_old)]   — per-sequence ratio, then the mean (verl)

IS-weight statistics (absent for mode ``none``), at the mode's level — per token for ``token``/``token_mask``,
per sequence (w_b = Π_t ρ_t) for ``sequence``/``sequence_mask``. As in verl they describe the weights *before*
truncation (only the ±20 log clamp applied), so max can exceed C:
  rollout_corr/rollout_is_mean            token-weighted mean of w
  rollout_corr/rollout_is_max|min         extreme w over valid tokens (sequences)
  rollout_corr/rollout_is_ratio_fraction_high   fraction of tokens (sequences) with w > C: those truncated/rejected
  rollout_corr/rollout_is_ratio_fraction_low    fraction with w < lower (lower = 1/C unless given)
  rollout_corr/rollout_is_std             token-weighted std of clamp(w, lower, C) (population std, as verl)
  rollout_corr/rollout_is_eff_sample_size (Σw̃)² / (N·Σw̃²) over valid tokens, w̃ = clamp(w, lower, C); in (0, 1]
                                          (verl's 1/E[(w̃/E w̃)²] without its 1e-8 guard)
  rollout_corr/rollout_rs_masked_fraction ``*_mask`` modes only: fraction of valid tokens rejected (verl's
                                          rollout_rs_masked_fraction, which lives under its rejection-sampling keys)

Deviations from verl, all only in degenerate inputs: sequences with no valid token are left out of E_seq and
of the sequence-level max/min/fractions (verl counts them as perplexity 1 / weight 1); k3_kl clamps lr to ±20
before exp like the other metrics; no valid token at all raises instead of asserting.
"""

from __future__ import annotations

import math

import torch

from repro.algos.shapes import AlgoShapeError, as_float_mask, require_rank, require_same_shape
from repro.algos.rollout_correction import ROLLOUT_IS_MODES, SAFETY_BOUND, RolloutISMode

PREFIX = "rollout_corr/"


def _tok_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum() / mask.sum())


@torch.no_grad()
def rollout_corr_metrics(
    logp_old: torch.Tensor,
    logp_rollout: torch.Tensor,
    response_mask: torch.Tensor,
    mode: RolloutISMode = "token",
    threshold: float = 2.0,
    threshold_lower: float | None = None,
) -> dict[str, float]:
    """All mismatch metrics of the batch (definitions in the module docstring).

    Args:
        logp_old: [B, T] trainer log-probs. logp_rollout: [B, T] rollout-engine log-probs.
        response_mask: [B, T] bool/0-1 with at least one valid token.
        mode, threshold, threshold_lower: as passed to ``rollout_is_weights``.
    Returns:
        dict of python floats, keys prefixed ``rollout_corr/``.
    """
    require_rank("logp_old", logp_old, 2)
    require_same_shape(logp_old=logp_old, logp_rollout=logp_rollout, response_mask=response_mask)
    if mode not in ROLLOUT_IS_MODES:
        raise AlgoShapeError(f"mode must be one of {ROLLOUT_IS_MODES}, got {mode!r}")
    old = logp_old.detach().double()
    roll = logp_rollout.detach().double()
    mask = as_float_mask(response_mask, old)
    if mask.sum() == 0:
        raise AlgoShapeError(f"response_mask {tuple(response_mask.shape)} has no valid token")

    lr = (old - roll) * mask
    lr_safe = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    rho = torch.exp(lr_safe)
    n_b = mask.sum(dim=-1)
    rows = n_b > 0
    seq_old = ((old * mask).sum(-1) / n_b.clamp(min=1))[rows]
    seq_roll = ((roll * mask).sum(-1) / n_b.clamp(min=1))[rows]
    seq_lr = lr.sum(-1)[rows]
    diff = seq_roll - seq_old

    out = {
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
        "ppl_ratio": float(torch.exp(diff).mean()),
    }

    if mode != "none":
        lower = 1.0 / threshold if threshold_lower is None else threshold_lower
        valid = mask > 0
        if mode.startswith("sequence"):
            unit_log_w = seq_lr  # one weight per non-empty sequence
            w_tok = torch.exp(lr.sum(-1, keepdim=True).clamp(-SAFETY_BOUND, SAFETY_BOUND)).expand_as(lr)
        else:
            unit_log_w = lr[valid]
            w_tok = rho
        unit_w = torch.exp(unit_log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND))
        w_clamped = w_tok.clamp(lower, threshold)
        mean_clamped = _tok_mean(w_clamped, mask)
        var = max(_tok_mean(w_clamped.square(), mask) - mean_clamped**2, 0.0)
        count = float(mask.sum())
        sum_w = float((w_clamped * mask).sum())
        sum_w2 = float((w_clamped.square() * mask).sum())
        out.update(
            {
                "rollout_is_mean": _tok_mean(w_tok, mask),
                "rollout_is_max": float(unit_w.max()),
                "rollout_is_min": float(unit_w.min()),
                "rollout_is_ratio_fraction_high": float((unit_log_w > math.log(threshold)).double().mean()),
                "rollout_is_ratio_fraction_low": float((unit_log_w < math.log(lower)).double().mean()),
                "rollout_is_std": math.sqrt(var) if count > 1 else 0.0,
                "rollout_is_eff_sample_size": sum_w**2 / (count * sum_w2),
            }
        )
        if mode.endswith("_mask"):
            outside = (w_tok < lower) | (w_tok > threshold)
            out["rollout_rs_masked_fraction"] = _tok_mean(outside.double(), mask)
    return {PREFIX + key: value for key, value in out.items()}
