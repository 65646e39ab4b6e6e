"""Rollout correction: importance weights between the rollout engine and the trainer.

FP8 vLLM samples from π_rollout while the BF16 trainer recomputes π_old for the same tokens; the two differ,
so the batch is off-policy even at step 0. Decoupled correction (Yao et al. 2025, "Your Efficient RL Framework
Secretly Brings You Off-Policy RL Training", fengyao.notion.site/off-policy-rl) keeps PPO's ratio
π_θ / π_old and multiplies each token's loss by a detached weight built from ρ = π_old / π_rollout:

  ``token``          w_t = min(ρ_t, C)                                  (truncated IS, the recipe: C = 2.0)
  ``sequence``       w_t = min(Π_t ρ_t, C) for every token of the sequence
  ``token_mask``     w_t = ρ_t if lower <= ρ_t <= upper else 0        (IcePop-style rejection per token,
                                                                       Ling Team 2025, "Ring-1T")
  ``sequence_mask``  w_t = Π ρ if lower <= Π ρ <= upper else 0, for the whole sequence
  ``none``           w_t = 1

verl calls these ``rollout_is: token|sequence`` and ``rollout_rs: token|sequence`` (rejection), with the
rejection lower bound defaulting to 1 / upper; we do the same. Logs are clamped to ±20 before exp (verl's
SAFETY_BOUND: exp(20) ≈ 4.9e8 is finite in fp32/bf16), applied to the summed log-ratio in the sequence modes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from repro.algos.shapes import AlgoShapeError, as_float_mask, require_rank, require_same_shape

RolloutISMode = Literal["token", "sequence", "token_mask", "sequence_mask", "none"]
ROLLOUT_IS_MODES: tuple[str, ...] = RolloutISMode.__args__  # type: ignore[attr-defined]

# verl's SAFETY_BOUND for exp() of log importance ratios.
SAFETY_BOUND = 20.0


@dataclass(frozen=True)
class RolloutWeights:
    """weights: [B, T] detached, 0 on padding. truncated_mask: [B, T] bool, valid tokens whose weight was
    changed — capped at C (``token``/``sequence``) or zeroed (``*_mask``). keep_mask: [B, T] bool, valid tokens
    that still carry a gradient (= response_mask except for rejected tokens in the ``*_mask`` modes)."""

    weights: torch.Tensor
    truncated_mask: torch.Tensor
    keep_mask: torch.Tensor


def clamped_log_ratio(
    logp_old: torch.Tensor, logp_rollout: torch.Tensor, response_mask: torch.Tensor, level: str
) -> torch.Tensor:
    """log ρ clamped to ±SAFETY_BOUND: per token ([B, T]) for level ``token``, or the per-sequence sum over
    valid tokens broadcast to [B, T] for level ``sequence``. Padding tokens contribute nothing to the sum."""
    log_ratio = (logp_old - logp_rollout).detach()
    if level == "sequence":
        mask = as_float_mask(response_mask, log_ratio)
        log_ratio = (log_ratio * mask).sum(dim=-1, keepdim=True).expand_as(log_ratio)
    return torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)


def rollout_is_weights(
    logp_old: torch.Tensor,
    logp_rollout: torch.Tensor,
    response_mask: torch.Tensor,
    mode: RolloutISMode = "token",
    threshold: float = 2.0,
    threshold_lower: float | None = None,
) -> RolloutWeights:
    """Decoupled rollout-correction weights (see module docstring for each mode).

    Args:
        logp_old: [B, T] trainer log-probs of the sampled tokens (BF16 Megatron recompute).
        logp_rollout: [B, T] rollout-engine log-probs of the same tokens (FP8 vLLM).
        response_mask: [B, T] bool/0-1.
        mode: one of ROLLOUT_IS_MODES.
        threshold: C, the truncation cap (``token``/``sequence``) or upper bound (``*_mask``).
        threshold_lower: lower bound of the ``*_mask`` modes; defaults to 1 / threshold.
    Returns:
        RolloutWeights; no gradient flows to either log-prob input.
    """
    require_rank("logp_old", logp_old, 2)
    require_same_shape(logp_old=logp_old, logp_rollout=logp_rollout, response_mask=response_mask)
    if mode not in ROLLOUT_IS_MODES:
        raise AlgoShapeError(f"mode must be one of {ROLLOUT_IS_MODES}, got {mode!r}")
    if threshold <= 0:
        raise AlgoShapeError(f"threshold must be positive, got {threshold}")
    mask = as_float_mask(response_mask, logp_old)
    valid = mask > 0
    if mode == "none":
        return RolloutWeights(mask.detach().clone(), torch.zeros_like(valid), valid)

    level = "sequence" if mode.startswith("sequence") else "token"
    rho = torch.exp(clamped_log_ratio(logp_old, logp_rollout, response_mask, level))
    if mode in ("token", "sequence"):
        truncated = valid & (rho > threshold)
        weights = torch.clamp(rho, max=threshold) * mask
        return RolloutWeights(weights, truncated, valid)

    lower = 1.0 / threshold if threshold_lower is None else threshold_lower
    inside = (rho >= lower) & (rho <= threshold)
    keep = valid & inside
    weights = rho * keep.to(rho.dtype)
    return RolloutWeights(weights, valid & ~inside, keep)
