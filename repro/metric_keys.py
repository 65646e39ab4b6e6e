"""The names of what a run logs: one place that the loop writes, the progress bar shows and the analysis reads.

Keys follow verl/LumenRL where a quantity has a name there (``rollout_corr/kl``, ``actor/grad_norm``), so other
frameworks' logs line up with ours after the importers' key map (``repro.analysis.importers``). The per-token
mismatch metrics are produced by ``repro.algos.metrics.rollout_corr_metrics`` under ``rollout_corr/``.
"""

from __future__ import annotations

# -- every row
KIND = "kind"            # "train" or "eval"
STEP = "step"            # 1-based optimizer step (0 = before the first update, evaluation only)

# -- training rows: reward and responses
ACCURACY = "reward/accuracy"
SCORE = "critic/score/mean"
ZERO_VARIANCE_GROUPS = "grpo/zero_variance_groups"
RESPONSE_LENGTH = "response_length/mean"
RESPONSE_LENGTH_MAX = "response_length/max"
RESPONSE_CLIP_RATIO = "response_length/clip_ratio"

# -- rollout throughput
THROUGHPUT = "perf/rollout_tokens_per_s"
GENERATED_TOKENS = "perf/generated_tokens"

# -- training-rollout mismatch (repro.algos.metrics.rollout_corr_metrics)
KL = "rollout_corr/kl"              # k1: mean(logp_rollout - logp_old); an unbiased sample estimate, can be < 0
K3_KL = "rollout_corr/k3_kl"        # k3: mean(rho - log rho - 1); never negative
CHI2_TOKEN = "rollout_corr/chi2_token"  # E[rho^2] - 1 per token; a sample estimate, can be < 0
CHI2_SEQ = "rollout_corr/chi2_seq"
ESS = "rollout_corr/rollout_is_eff_sample_size"  # (sum w)^2 / (n sum w^2) of the truncated weights, a 0-1 fraction
IS_MAX = "rollout_corr/rollout_is_max"
IS_FRACTION_HIGH = "rollout_corr/rollout_is_ratio_fraction_high"

# -- the update (repro.train: verl's actor/* names)
LOSS = "actor/loss"
GRAD_NORM = "actor/grad_norm"
ENTROPY = "actor/entropy"
LR = "actor/lr"

# -- weight sync
SYNC_GBPS = "weight_sync/gbps"
SYNC_SECONDS = "weight_sync/seconds"
SYNC_BYTES = "weight_sync/bytes"
SYNC_BUCKETS = "weight_sync/buckets"
SYNC_VERSION = "weight_sync/version"

# -- timing: one key per named phase of a step (``timing_s/<phase>``), the whole step, and evaluations
TIMING_PREFIX = "timing_s/"
STEP_SECONDS = "timing_s/step"
EVAL_SECONDS = "timing_s/eval"
WARMUP_SECONDS = "timing_s/warmup"


def timing_key(phase: str) -> str:
    return TIMING_PREFIX + phase


# -- evaluation rows
EVAL_AVG_PREFIX = "eval/avg@"
CORRECT_COUNTS = "eval/correct_counts"
NUM_PROBLEMS = "eval/num_problems"
SAMPLES_PER_PROBLEM = "eval/samples_per_problem"


def eval_avg_key(samples_per_problem: int) -> str:
    return f"{EVAL_AVG_PREFIX}{samples_per_problem}"
