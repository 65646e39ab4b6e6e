"""The GRPO update, whatever backend runs the forward and backward: which rows go forward, the update's
normalisers, each micro-batch's share of the loss, and the metrics. Both trainers run it through the steps they
inherit (``repro.train.grpo_trainer``): the embedded torch trainer with its own micro-batch loop, the Megatron
trainer inside megatron's pipeline schedule.

One ``train_step`` = the batch split into ``updates_per_step`` row groups, one optimizer update each. Per update:

  1. decoupled TIS weights w = min(exp(old - rollout), C) from the trainer's recompute (``batch.old_logprobs``)
     and the rollout engine's log-probs -- fixed before any forward, so the loss mask and its normaliser are
     known up front (Yao et al., "Your efficient RL framework secretly brings you off-policy RL training", 2025);
  2. rows whose advantage is exactly 0 are skipped: their loss is -0 * ratio * w = 0 for every token, so their
     forward/backward would add exactly nothing, but they still count in the normaliser (GRPO's zero-variance
     groups are 25-40% of the rows on the tiny task);
  3. the remaining rows go through token-budget micro-batches, each micro-batch's aggregated loss rescaled to its
     share of the whole update, so the accumulated gradient equals the one-big-batch gradient whatever the
     micro-batching;
  4. global-norm clip and AdamW (the backend's, with its own notion of "global").
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import ClassVar

import torch

from repro import metric_keys as K
from repro.algos import agg_loss, broadcast_to_tokens, ppo_clip_loss, rollout_is_weights
from repro.recipes.backends import trainer_of
from repro.recipes.schema import AlgorithmConfig, OptimConfig, Recipe, RolloutCorrectionConfig
from repro.train.base import TrainerError
from repro.train.batch import TrainBatch
from repro.train.precision import COMPUTE_DTYPES

REJECTING_MODES = ("token_mask", "sequence_mask")  # their kept tokens depend on pi_old, needed before any forward
COUNT_METRICS = (K.ROWS_SKIPPED_ZERO_ADV, K.MICRO_BATCHES)  # summed over updates, not averaged


@dataclass
class UpdateStats:
    """Sums over one update's forwarded micro-batches; token-weighted means are formed at the end."""

    loss: float = 0.0
    tokens: float = 0.0            # kept response tokens that went through a forward
    response_tokens: float = 0.0   # all response tokens that went through a forward (entropy's denominator)
    entropy_sum: float = 0.0
    clipfrac_sum: float = 0.0
    clipfrac_lower_sum: float = 0.0
    ppo_kl_sum: float = 0.0
    update_tokens: float = 0.0     # kept response tokens of the whole update, skipped rows included (the plan's)
    rows_skipped: int = 0
    micro_batches: int = 0

    WHOLE_BATCH: ClassVar[tuple[str, ...]] = ("rows_skipped", "update_tokens")  # the plan's: never summed over shares

    def add(self, other: "UpdateStats") -> None:
        """Add another share of the same update's sums (``rows_skipped`` and ``update_tokens`` are the plan's,
        counted once)."""
        for name in ("loss", "tokens", "response_tokens", "entropy_sum", "clipfrac_sum", "clipfrac_lower_sum",
                     "ppo_kl_sum", "micro_batches"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass(frozen=True)
class UpdatePlan:
    """Which rows of a batch go through a forward ([R] row indices), and the update's normalisers."""

    rows: torch.Tensor
    total_tokens: int   # kept response tokens of the whole update (token-mean's normaliser)
    total_rows: int     # rows with at least one kept token (the seq-mean modes' normaliser)


def scores_in_update(algorithm: AlgorithmConfig, correction: RolloutCorrectionConfig) -> bool:
    """Whether an update's own first forward can give pi_old (the separate rescoring pass then scores only the
    rows the update skips). Exact when there is one update per step: the policy that forwards is still the one
    that would have rescored, so the log-probs are the same numbers. Not with several updates per step (later
    updates need the pre-update policy) nor with a rejecting correction mode (its kept tokens, and with them the
    update's normaliser, depend on pi_old of every row before the first forward)."""
    return algorithm.updates_per_step == 1 and correction.mode not in REJECTING_MODES


def old_logprobs_from_update(recipe: Recipe) -> bool:
    """Whether the loop takes pi_old from the update (``scored_train_step``): the recipe asks for it, its trainer
    backend can (``repro.recipes.backends``), and it is exact (``scores_in_update``)."""
    return (trainer_of(recipe).scores_in_update and recipe.actor.old_logprobs_from_update
            and scores_in_update(recipe.algorithm, recipe.rollout_correction))


@dataclass(frozen=True)
class TrainerSettings:
    """What every trainer backend takes from the recipe, declared once for both constructors (the model and each
    backend's own arguments come separately).

    ``dtype``, ``max_tokens_per_micro_batch`` and ``temperature`` have no default: a trainer built outside a
    recipe (a test, a benchmark, a study) states them, so it cannot quietly score at another temperature than its
    rollout samples at, or train in another precision than the run it stands for. The three recipe sections default
    to the schema's defaults (AMD's run); ``seed`` seeds torch's RNG once at construction (a recipe passes its own;
    the forward draws no random numbers)."""

    dtype: str                         # "fp32" or "bf16": the compute dtype (AdamW keeps fp32 masters either way)
    max_tokens_per_micro_batch: int    # padded tokens (rows x width) per forward
    temperature: float                 # the rollout's: log-probs are of softmax(logits / temperature)
    optim: OptimConfig = field(default_factory=OptimConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    replay_routing: bool = True        # R3 in train_step (``logprobs`` takes its own flag)
    skip_zero_advantage_rows: bool = True  # skip the forward/backward of rows whose advantage is 0 (same gradient)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in COMPUTE_DTYPES:
            raise TrainerError(f"dtype must be one of {sorted(COMPUTE_DTYPES)}, got {self.dtype!r}")
        if self.max_tokens_per_micro_batch < 1 or self.temperature <= 0:
            raise TrainerError(f"max_tokens_per_micro_batch must be >= 1 and temperature > 0, got "
                               f"{self.max_tokens_per_micro_batch} and {self.temperature}")

    @classmethod
    def from_recipe(cls, recipe: Recipe, **changes) -> "TrainerSettings":
        """The recipe's settings, with ``changes`` (field names of this class) over them."""
        return replace(cls(
            dtype=recipe.actor.dtype, max_tokens_per_micro_batch=recipe.actor.max_tokens_per_micro_batch,
            temperature=recipe.rollout.temperature, optim=recipe.optim, algorithm=recipe.algorithm,
            rollout_correction=recipe.rollout_correction, replay_routing=recipe.routing_replay.enabled,
            seed=recipe.seed), **changes)

    @staticmethod
    def split(arguments: dict) -> tuple[dict, dict]:
        """``arguments`` as (this class's fields, the rest): a ``from_recipe`` override may name either."""
        names = {f.name for f in fields(TrainerSettings)}
        return ({k: v for k, v in arguments.items() if k in names},
                {k: v for k, v in arguments.items() if k not in names})

    def update_rules(self, backend: str) -> "GRPOUpdate":
        """The update these settings describe, refusing what the ``backend`` trainer cannot honour."""
        if self.algorithm.kl_coef != 0 or self.algorithm.entropy_coef != 0:
            # Both would also make zero-advantage rows carry gradient, which the row skipping relies on not doing.
            raise TrainerError(
                f"algorithm.kl_coef={self.algorithm.kl_coef}, entropy_coef={self.algorithm.entropy_coef}: the "
                f"{backend} trainer implements neither (the reproduced run uses 0 for both)")
        return GRPOUpdate(self.algorithm, self.rollout_correction, self.skip_zero_advantage_rows)


@dataclass(frozen=True)
class GRPOUpdate:
    """The update's rules for one recipe: PPO clip-higher loss with TIS weights, aggregated as the recipe says."""

    algorithm: AlgorithmConfig
    correction: RolloutCorrectionConfig
    skip_zero_advantage_rows: bool = True

    def row_groups(self, batch: TrainBatch) -> list[torch.Tensor]:
        """[rows] index tensors, one per optimizer update of the step (``updates_per_step`` of them)."""
        count = self.algorithm.updates_per_step
        if count > batch.num_rows:
            raise TrainerError(f"algorithm.updates_per_step={count} exceeds the batch's {batch.num_rows} rows")
        return list(torch.arange(batch.num_rows).tensor_split(count))

    def is_weights(self, batch: TrainBatch):
        return rollout_is_weights(
            batch.old_logprobs, batch.rollout_logprobs, batch.response_mask, mode=self.correction.mode,
            threshold=self.correction.threshold, threshold_lower=self.correction.lower_threshold,
        )

    @property
    def scores_in_update(self) -> bool:
        """The update can take pi_old from its own forward (``scores_in_update``)."""
        return scores_in_update(self.algorithm, self.correction)

    def keep_mask(self, batch: TrainBatch) -> torch.Tensor:
        """[B, T] bool: the tokens the loss keeps. Without ``old_logprobs`` (pi_old still to come from the update's
        own forward) only a non-rejecting mode knows them: every response token."""
        if batch.old_logprobs is None:
            if not self.scores_in_update:
                raise TrainerError("batch.old_logprobs is missing: a rejecting correction mode or several updates "
                                   "per step need pi_old before the update")
            return batch.response_mask.bool()
        return self.is_weights(batch).keep_mask

    def plan(self, batch: TrainBatch, stats: UpdateStats) -> UpdatePlan | None:
        """Which rows of ``batch`` go through a forward, and the normalisers; None when nothing does. Counts the
        skipped zero-advantage rows into ``stats``."""
        keep = self.keep_mask(batch)
        total_tokens = int(keep.sum())
        total_rows = int(keep.any(dim=1).sum())
        if total_tokens == 0:
            return None
        forwarded = keep.any(dim=1)  # rows with no kept token (all rejected, or no response) add nothing either
        stats.update_tokens = float(total_tokens)
        if self.skip_zero_advantage_rows:
            stats.rows_skipped = int((forwarded & (batch.advantages == 0)).sum())
            forwarded &= batch.advantages != 0
        if not forwarded.any():
            return None
        return UpdatePlan(forwarded.nonzero().squeeze(1), total_tokens, total_rows)

    def micro_loss(self, micro: TrainBatch, logp: torch.Tensor, entropy: torch.Tensor, plan: UpdatePlan,
                   stats: UpdateStats) -> torch.Tensor:
        """This micro-batch's share of the update's loss from its [b, t] log-probs (and, for the metrics, its
        [b, t] entropies); adds its sums to ``stats``."""
        micro_w = self.is_weights(micro)
        micro_keep = micro_w.keep_mask
        policy = ppo_clip_loss(
            logp,
            micro.old_logprobs,
            broadcast_to_tokens(micro.advantages, micro.response_mask),
            micro_keep,
            clip_low=self.algorithm.clip_ratio_low,
            clip_high=self.algorithm.clip_ratio_high,
            clip_ratio_c=self.algorithm.clip_ratio_c,
            is_weights=micro_w.weights,
        )
        # Each micro-batch's mean, weighted by its share of the update's normaliser (tokens or sequences),
        # sums to the mean over the whole update.
        mode = self.algorithm.loss_agg_mode
        if mode == "token-mean":
            share = int(micro_keep.sum()) / plan.total_tokens
        else:
            share = int(micro_keep.any(dim=1).sum()) / plan.total_rows
        loss = agg_loss(policy.loss_mat, micro_keep, mode) * share
        with torch.no_grad():
            tokens = float(micro_keep.sum())
            stats.loss += float(loss)
            stats.tokens += tokens
            stats.response_tokens += float(micro.response_mask.sum())
            stats.entropy_sum += float((entropy * micro.response_mask).sum())
            stats.clipfrac_sum += float(policy.pg_clipfrac) * tokens
            stats.clipfrac_lower_sum += float(policy.pg_clipfrac_lower) * tokens
            stats.ppo_kl_sum += float(policy.ppo_kl) * tokens
            stats.micro_batches += 1
        return loss


def update_metrics(stats: UpdateStats, grad_norm: float, lr: float) -> dict[str, float]:
    """verl-named metrics of one update. ``actor/ppo_kl`` is LumenRL's: Σ(old - new) over every kept token of the
    update, the rows it skipped included; their term is 0, since their log-probs under the weights the update
    starts from are π_old's (LumenRL forwards them and so also sees the two passes' rounding, which is not
    measured here). The clip fractions and ``actor/entropy_nonzero_adv`` are token means over the rows that went
    through a forward; ``actor/entropy`` over every row is the loop's, from π_old (``repro.run.steps``)."""
    per_token = max(stats.tokens, 1.0)
    return {
        K.LOSS: stats.loss,
        K.GRAD_NORM: grad_norm,
        K.ENTROPY_NONZERO_ADV: stats.entropy_sum / max(stats.response_tokens, 1.0),
        K.PG_CLIPFRAC: stats.clipfrac_sum / per_token,
        K.PG_CLIPFRAC_LOWER: stats.clipfrac_lower_sum / per_token,
        K.PPO_KL: stats.ppo_kl_sum / max(stats.update_tokens, 1.0),
        K.LR: lr,
        K.ROWS_SKIPPED_ZERO_ADV: float(stats.rows_skipped),
        K.MICRO_BATCHES: float(stats.micro_batches),
    }
