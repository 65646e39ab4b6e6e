"""PPO clipped surrogate with clip-higher and dual-clip, and loss aggregation.

PPO: Schulman et al. 2017, arXiv:1707.06347. Clip-higher (asymmetric ε_low / ε_high, recipe 0.2 / 0.28):
DAPO, Yu et al. 2025, arXiv:2503.14476. Dual-clip (cap the loss of negative-advantage tokens at -A·c):
Ye et al. 2020, arXiv:1912.09729; off unless ``clip_ratio_c`` is given (verl's default is 3.0; LumenRL's GRPO loss,
which AMD ran, leaves it off). Metric names follow verl's
``compute_policy_loss_vanilla``: ``pg_clipfrac``, ``pg_clipfrac_lower``, ``ppo_kl``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from repro.algos.shapes import AlgoShapeError, as_float_mask, require_rank, require_same_shape

LossAggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
LOSS_AGG_MODES: tuple[str, ...] = LossAggMode.__args__  # type: ignore[attr-defined]

# Same bound verl uses on log(π/π_old) before exp: exp(20) ≈ 4.9e8 stays finite in bf16/fp32.
LOG_RATIO_CLAMP = 20.0


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: LossAggMode,
    *,
    norm_length: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar. Padding (mask 0) never contributes.

    With m = loss_mask, L = loss_mat, n_b = Σ_t m[b,t], and S = {b : n_b > 0} (sequences with any valid token):
      * ``token-mean``:              Σ_{b,t} L·m / Σ_{b,t} m — every valid token weighs the same (DAPO).
      * ``seq-mean-token-mean``:     (1/|S|) Σ_{b∈S} (Σ_t L·m / n_b) — every sequence weighs the same
                                     (original GRPO; the recipe's mode).
      * ``seq-mean-token-sum``:      (1/|S|) Σ_{b∈S} Σ_t L·m — longer sequences weigh more.
      * ``seq-mean-token-sum-norm``: Σ_{b,t} L·m / norm_length, norm_length defaulting to T (Dr.GRPO's
                                     constant normaliser; note it sums, not averages, over sequences, as verl does).
    Sequences with no valid token are left out of |S| rather than counted as zero (verl divides the
    seq-mean modes by B, and seq-mean-token-mean turns such rows into NaN); the two agree when S is every row.
    A batch with no valid token at all returns 0, still connected to the graph so backward() works.

    Args:
        loss_mat: [B, T]. loss_mask: [B, T] bool/0-1.
    Returns:
        0-dim tensor.
    """
    require_rank("loss_mat", loss_mat, 2)
    require_same_shape(loss_mat=loss_mat, loss_mask=loss_mask)
    mask = as_float_mask(loss_mask, loss_mat)
    masked = loss_mat * mask
    zero = masked.sum() * 0.0
    if mode == "token-mean":
        count = mask.sum()
        return masked.sum() / count if count > 0 else zero
    if mode == "seq-mean-token-sum-norm":
        length = float(loss_mat.shape[-1]) if norm_length is None else float(norm_length)
        if length <= 0:
            raise AlgoShapeError(f"norm_length must be positive, got {length} for loss_mat {tuple(loss_mat.shape)}")
        return masked.sum() / length
    if mode not in ("seq-mean-token-mean", "seq-mean-token-sum"):
        raise AlgoShapeError(f"mode must be one of {LOSS_AGG_MODES}, got {mode!r}")
    tokens_per_seq = mask.sum(dim=-1)
    nonempty = tokens_per_seq > 0
    num_seqs = nonempty.sum()
    if num_seqs == 0:
        return zero
    seq_loss = masked.sum(dim=-1)
    if mode == "seq-mean-token-mean":
        seq_loss = seq_loss / tokens_per_seq.clamp(min=1.0)
    return (seq_loss * nonempty).sum() / num_seqs


@dataclass(frozen=True)
class PolicyLoss:
    """loss_mat: [B, T] per-token loss (0 on padding), IS weights already applied.
    Scalars (0-dim, detached), each a mean over valid tokens:
      pg_clipfrac        tokens where the ε-clip is active = pg_clipfrac_high + pg_clipfrac_low (verl's key)
      pg_clipfrac_high   A > 0 and ratio > 1 + ε_high (our key)
      pg_clipfrac_low    A < 0 and ratio < 1 - ε_low (our key)
      pg_clipfrac_lower  A < 0 and ratio > c: the dual-clip is active (verl's key; 0 without dual-clip)
      ppo_kl             mean(log π_old - log π) (verl's key)."""

    loss_mat: torch.Tensor
    pg_clipfrac: torch.Tensor
    pg_clipfrac_high: torch.Tensor
    pg_clipfrac_low: torch.Tensor
    pg_clipfrac_lower: torch.Tensor
    ppo_kl: torch.Tensor


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    count = mask.sum()
    return (values * mask).sum() / count if count > 0 else (values * mask).sum() * 0.0


def ppo_clip_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    clip_ratio_c: float | None = None,
    is_weights: torch.Tensor | None = None,
) -> PolicyLoss:
    """Per-token PPO-clip loss, r = exp(clamp(logp - logp_old, ±20)):

        L = max(-A·r, -A·clip(r, 1 - ε_low, 1 + ε_high))        (clip-higher, DAPO)
        L = min(L, -A·c)  where A < 0, if clip_ratio_c is given (dual-clip; needs c > 1)
        L = L · w         with w = is_weights.detach() (decoupled TIS, see rollout_correction)

    A clipped token's loss is a constant in logp, so it contributes no gradient.

    Args:
        logp: [B, T] log π_θ of the sampled tokens (requires grad).
        logp_old: [B, T] log π_old from the trainer's recompute (proximal policy); treated as constant.
        advantages: [B, T].
        response_mask: [B, T] bool/0-1.
        clip_low, clip_high: ε_low, ε_high.
        clip_ratio_c: dual-clip constant c, or None to disable.
        is_weights: optional [B, T] truncated IS weights; detached here whatever the caller passes.
    """
    require_rank("logp", logp, 2)
    require_same_shape(logp=logp, logp_old=logp_old, advantages=advantages, response_mask=response_mask)
    if is_weights is not None:
        require_same_shape(logp=logp, is_weights=is_weights)
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise AlgoShapeError(f"clip_ratio_c must be > 1 for dual-clip, got {clip_ratio_c}")
    mask = as_float_mask(response_mask, logp)
    adv = advantages.detach()
    log_ratio = torch.clamp(logp - logp_old.detach(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)

    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    clip_active = (clipped > unclipped).to(mask.dtype)
    high = clip_active * (adv > 0).to(mask.dtype)
    low = clip_active * (adv < 0).to(mask.dtype)

    if clip_ratio_c is not None:
        dual_bound = -adv * clip_ratio_c
        negative = adv < 0
        dual_active = (negative & (loss > dual_bound)).to(mask.dtype)
        loss = torch.where(negative, torch.minimum(loss, dual_bound), loss)
    else:
        dual_active = torch.zeros_like(mask)

    if is_weights is not None:
        loss = loss * is_weights.detach()
    loss = loss * mask

    with torch.no_grad():
        return PolicyLoss(
            loss_mat=loss,
            pg_clipfrac=_masked_mean(clip_active, mask),
            pg_clipfrac_high=_masked_mean(high, mask),
            pg_clipfrac_low=_masked_mean(low, mask),
            pg_clipfrac_lower=_masked_mean(dual_active, mask),
            ppo_kl=_masked_mean(-log_ratio.detach(), mask),
        )
