"""Algorithm math of the GRPO run as pure tensor functions (torch only, no Ray/vLLM/Megatron).

advantages          GRPO / Dr.GRPO group advantages                      (Shao et al. 2024; Liu et al. 2025)
policy_loss         PPO-clip with clip-higher and dual-clip; agg_loss    (Schulman 2017; Yu et al. 2025; Ye 2020)
rollout_correction  decoupled truncated / masked importance weights      (Yao et al. 2025)
metrics             rollout_corr/* mismatch metrics: LumenRL's keys and definitions, verl's variants, by position;
                    per sequence (the rollouts on disk)
logits              log-probs and entropy under the sampling temperature; their mean over response tokens
"""

from repro.algos.shapes import AlgoShapeError
from repro.algos.advantages import GroupAdvantages, broadcast_to_tokens, grpo_advantages
from repro.algos.logits import entropy_from_logits, logprobs_from_logits, response_token_mean
from repro.algos.metrics import (SequenceMismatch, is_metrics, offpolicy_metrics, position_metrics,
                                 rollout_corr_metrics, sequence_mismatch, verl_is_metrics)
from repro.algos.policy_loss import LOSS_AGG_MODES, LossAggMode, PolicyLoss, agg_loss, ppo_clip_loss
from repro.algos.rollout_correction import (
    ROLLOUT_IS_MODES,
    SAFETY_BOUND,
    RolloutISMode,
    RolloutWeights,
    rollout_is_weights,
)

__all__ = [
    "AlgoShapeError",
    "GroupAdvantages",
    "LOSS_AGG_MODES",
    "LossAggMode",
    "PolicyLoss",
    "ROLLOUT_IS_MODES",
    "RolloutISMode",
    "RolloutWeights",
    "SAFETY_BOUND",
    "SequenceMismatch",
    "agg_loss",
    "broadcast_to_tokens",
    "entropy_from_logits",
    "grpo_advantages",
    "is_metrics",
    "logprobs_from_logits",
    "offpolicy_metrics",
    "position_metrics",
    "ppo_clip_loss",
    "response_token_mean",
    "rollout_corr_metrics",
    "rollout_is_weights",
    "sequence_mismatch",
    "verl_is_metrics",
]
