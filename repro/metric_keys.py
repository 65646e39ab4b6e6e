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
GRAD_NORM = "actor/grad_norm"              # global norm before clipping
ENTROPY = "actor/entropy"                  # every response token of the step's rows, from pi_old's pass (LumenRL's)
ENTROPY_NONZERO_ADV = "actor/entropy_nonzero_adv"  # only the rows the update forwards (advantage != 0)
LR = "actor/lr"
PG_CLIPFRAC = "actor/pg_clipfrac"
PG_CLIPFRAC_LOWER = "actor/pg_clipfrac_lower"
PPO_KL = "actor/ppo_kl"                    # mean(old - new) over every kept token; skipped rows count as 0
ROWS_SKIPPED_ZERO_ADV = "actor/num_rows_skipped_zero_adv"  # a count: summed over a step's updates
MICRO_BATCHES = "actor/micro_batches"                      # a count: summed over a step's updates
BF16_GEMM_FP32 = "actor/bf16_gemm_fp32"  # BF16 trainer on CPU: 1 = FP32 GEMMs rounded to BF16, 0 = torch's BF16 matmul

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


# -- training-rollout mismatch by response position, as LumenRL logs it since 2232f55
#    (lumenrl/trainer/rl_trainer.py, RLTrainer._mismatch_by_response_position): buckets of the 0-based position of a
#    token inside its response, [0, 128), [128, 512), [512, 1024), [1024, 2048), [2048, 4096); tokens past 4,095 are in
#    no bucket. A bucket with no token that step is not logged at all.
POSITION_BUCKET_EDGES: tuple[int, ...] = (128, 512, 1024, 2048, 4096)
POSITION_STATS: tuple[str, ...] = ("kl", "abs_diff", "k3_kl", "tokens")


def position_buckets() -> list[tuple[int, int]]:
    """[(start, end_exclusive), ...] of LumenRL's response-position buckets."""
    starts = (0,) + POSITION_BUCKET_EDGES[:-1]
    return list(zip(starts, POSITION_BUCKET_EDGES))


def position_key(start: int, end: int, stat: str) -> str:
    """``rollout_corr/pos_{start}_{end-1}/{stat}``, LumenRL's key for one bucket's statistic."""
    return f"rollout_corr/pos_{start}_{end - 1}/{stat}"


POSITION_KEYS: tuple[str, ...] = tuple(position_key(s, e, stat)
                                       for s, e in position_buckets() for stat in POSITION_STATS)
