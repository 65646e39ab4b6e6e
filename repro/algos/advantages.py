"""GRPO group-relative advantages.

GRPO (Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300) replaces the critic with a per-prompt baseline:
each of the G responses to one prompt gets advantage (r_i - mean(r)) / (std(r) + eps). Dr.GRPO (Liu et al.
2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783) drops the std division because it
up-weights prompts that are nearly always right or nearly always wrong.

Two conventions for the std, both in use (``std=``):
  * ``"population"`` -- LumenRL's GRPO (``lumenrl/algorithms/advantage_estimators.py``, AMD's run): the population
    std (divisor n), clamped below at 1e-8: (r - mean) / max(std, 1e-8);
  * ``"sample"`` -- verl's ``compute_grpo_outcome_advantage``: the unbiased std (``torch.std``, divisor n - 1),
    with eps = 1e-6 added to it: (r - mean) / (std + eps). For G = 8 and +-1 rewards its advantages are
    sqrt(7/8) = 0.935 times the population ones.
A group with a single response gets mean 0 and std 1 (verl's rule, so its advantage is r / (1 + eps) under
``sample``, r under ``population``); the recipe (G = 8) never produces such groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from repro.algos.shapes import AlgoShapeError, as_float_mask, require_rank


POPULATION_STD_FLOOR = 1e-8  # LumenRL's clamp_min on the population std


@dataclass(frozen=True)
class GroupAdvantages:
    """advantages: same shape as the scores ([B] or [P, G]); num_zero_variance_groups: groups of size >= 2
    whose scores are all equal (their advantages are exactly 0, so they carry no policy gradient);
    num_groups: number of distinct groups."""

    advantages: torch.Tensor
    num_zero_variance_groups: int
    num_groups: int


def grpo_advantages(
    scores: torch.Tensor,
    group_ids: torch.Tensor | None = None,
    *,
    norm_by_std: bool = True,
    std: Literal["population", "sample"] = "sample",
    eps: float = 1e-6,
) -> GroupAdvantages:
    """Per-sequence GRPO advantage.

    Args:
        scores: [P, G] (row p holds prompt p's G responses) or [B] with ``group_ids``.
        group_ids: [B] integer group id per response; required for 1-D scores, forbidden for 2-D scores.
            Ids need not be contiguous or sorted.
        norm_by_std: True = GRPO, (r - mean) / std'; False = Dr.GRPO, r - mean.
        std: ``"population"`` (LumenRL: std' = max(population std, 1e-8)) or ``"sample"`` (verl: std' = unbiased
            std + eps); see the module docstring.
        eps: added to the group std under ``"sample"``.

    Returns:
        GroupAdvantages with ``advantages`` shaped like ``scores`` (float, no grad).
    """
    if scores.dim() == 2:
        if group_ids is not None:
            raise AlgoShapeError(f"group_ids must be None when scores is [P, G], got scores {tuple(scores.shape)}")
        num_prompts, group_size = scores.shape
        flat_ids = torch.arange(num_prompts, device=scores.device).repeat_interleave(group_size)
        result = grpo_advantages(scores.reshape(-1), flat_ids, norm_by_std=norm_by_std, std=std, eps=eps)
        return GroupAdvantages(
            result.advantages.reshape(num_prompts, group_size),
            result.num_zero_variance_groups,
            result.num_groups,
        )
    require_rank("scores", scores, 1)
    if group_ids is None:
        raise AlgoShapeError(f"group_ids is required when scores is 1-D, got scores {tuple(scores.shape)}")
    if group_ids.shape != scores.shape:
        raise AlgoShapeError(f"shape mismatch: scores {tuple(scores.shape)}, group_ids {tuple(group_ids.shape)}")

    with torch.no_grad():
        values = scores.detach().to(torch.float64)  # float64 so means of 0/1 rewards are exact
        _, inverse = torch.unique(group_ids, return_inverse=True)
        num_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
        counts = torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(
            0, inverse, torch.ones_like(values)
        )
        sums = torch.zeros_like(counts).index_add_(0, inverse, values)
        means = sums / counts
        centred = values - means[inverse]
        sq = torch.zeros_like(counts).index_add_(0, inverse, centred.square())
        singleton = counts == 1
        if std not in ("population", "sample"):
            raise AlgoShapeError(f"std must be 'population' or 'sample', got {std!r}")
        divisor = counts if std == "population" else (counts - 1).clamp(min=1)
        group_std = torch.sqrt(sq / divisor)
        # verl's convention for one-response groups: no baseline, unit scale.
        means = torch.where(singleton, torch.zeros_like(means), means)
        group_std = torch.where(singleton, torch.ones_like(group_std), group_std)
        scale = group_std.clamp(min=POPULATION_STD_FLOOR) if std == "population" else group_std + eps
        advantages = values - means[inverse]
        if norm_by_std:
            advantages = advantages / scale[inverse]
        num_zero_var = int(((~singleton) & (sq == 0)).sum().item())
    return GroupAdvantages(advantages.to(scores.dtype if scores.is_floating_point() else torch.float32),
                           num_zero_var, num_groups)


def broadcast_to_tokens(advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Outcome reward: every response token of sequence b gets advantage[b]; padding gets 0.

    Args:
        advantages: [B].
        response_mask: [B, T], 1/True on response tokens.
    Returns:
        [B, T] float.
    """
    require_rank("advantages", advantages, 1)
    require_rank("response_mask", response_mask, 2)
    if advantages.shape[0] != response_mask.shape[0]:
        raise AlgoShapeError(
            f"shape mismatch: advantages {tuple(advantages.shape)}, response_mask {tuple(response_mask.shape)}"
        )
    return advantages.unsqueeze(-1) * as_float_mask(response_mask, advantages)
