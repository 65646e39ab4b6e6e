"""A run beside another published DeepSeek-V4 RL run (``repro.reference.PUBLISHED``: Miles on MI355X, verl's PR),
one row per number that run published, in the rows' shape of ``repro.analysis.compare`` (its ``amd`` column holds
the reference's value). AMD's run keeps its own table (``compare_to_amd``); this one serves every other reference.

What each ``measures`` takes from a run's logs:
  eval_avg               the held-out avg@k (pass@1 estimated from k samples) of the first evaluation, or of the one at
                         step ``at``, with the bootstrap interval over problems (repro runs)
  eval_pass_at_k         pass@k over problems, 1 - C(n - c, k) / C(n, k) per problem with c of n samples correct (the
                         unbiased estimator; n = k: the share of problems with a correct sample); needs per-problem
                         counts, which only repro runs log
  mean_abs_logprob_diff  per step, mean |log π_rollout - log π_trainer| over response tokens (LumenRL's position
                         buckets' abs_diff weighted by their tokens), then the mean over the logged steps
  reward_step_min|max    the lowest / highest single step's reward accuracy
  kl, k3_kl              rollout_corr/kl, rollout_corr/k3_kl at the first logged step, or at step ``at``
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from repro.analysis import summary
from repro.analysis.compare import COLUMNS, NAN, _row, lacks
from repro.analysis.frame import ACCURACY, K3_KL, KL, RunFrames
from repro.metric_keys import CORRECT_COUNTS, SAMPLES_PER_PROBLEM, position_buckets, position_key
from repro.reference import PublishedRun, Reference


def pass_at_k(correct_counts, samples: int, k: int) -> float:
    """Mean over problems of the unbiased pass@k from ``samples`` draws per problem (Chen et al. 2021)."""
    if not 1 <= k <= samples:
        raise ValueError(f"pass@{k} needs 1 <= k <= {samples} samples per problem")
    counts = [int(c) for c in correct_counts]
    return float(np.mean([1.0 - math.comb(samples - c, k) / math.comb(samples, k) for c in counts]))


def abs_logprob_diff_by_step(frames: RunFrames) -> pd.Series:
    """Per step, mean |log π_rollout - log π_trainer| over the response tokens in LumenRL's position buckets."""
    weighted, tokens = 0.0, 0.0
    for start, end in position_buckets():
        diff, count = position_key(start, end, "abs_diff"), position_key(start, end, "tokens")
        if diff in frames.train.columns and count in frames.train.columns:
            n = frames.train[count].fillna(0.0)
            weighted = weighted + frames.train[diff].fillna(0.0) * n
            tokens = tokens + n
    if isinstance(tokens, float):
        return pd.Series(dtype=float, name="abs_logprob_diff")
    return (weighted / tokens.where(tokens > 0)).dropna().rename("abs_logprob_diff")


def _eval_row(frames: RunFrames, at) -> tuple[int | None, pd.Series | None, str]:
    """The evaluation at ``at`` ('first', or a step: that one, else the last before it), and a note."""
    if frames.eval.empty:
        return None, None, "no evaluation in this source"
    steps = [int(s) for s in frames.eval.index]
    if at == "first":
        return steps[0], frames.eval.loc[steps[0]], ""
    before = [s for s in steps if s <= int(at)]
    step = before[-1] if before else steps[0]
    return step, frames.eval.loc[step], "" if step == int(at) else f"step {step}, the reference's is step {at}"


def _eval_avg(frames: RunFrames, ref: Reference, name: str) -> dict:
    key = frames.avg_key or "eval/avg@k"
    table = summary.eval_table(frames)
    step, _, note = _eval_row(frames, ref.at)
    if step is None or table.empty:
        return _row(name, "fraction", key, ref.value, note=lacks(key))
    e = table.loc[step]
    k = int(key.split("@")[1])
    notes = [note] + ([f"avg@{k}, the reference's samples: {ref.k}"] if ref.k and ref.k != k else [])
    band = "bootstrap 95% over problems" if e["problems"] else "no band"
    return _row(name, "fraction", key, ref.value, e["avg"], step, e["low"], e["high"], band,
                "; ".join(filter(None, notes)))


def _eval_pass_at_k(frames: RunFrames, ref: Reference, name: str) -> dict:
    key = f"pass@{ref.k} from {CORRECT_COUNTS}"
    step, row, note = _eval_row(frames, ref.at)
    if row is None or not isinstance(row.get(CORRECT_COUNTS), (list, np.ndarray)):
        return _row(name, "fraction", key, ref.value, note=f"no `{CORRECT_COUNTS}` in this source (repro runs log it)")
    samples = int(row.get(SAMPLES_PER_PROBLEM))
    if samples < ref.k:
        return _row(name, "fraction", key, ref.value, step=step,
                    note=f"{samples} samples per problem, pass@{ref.k} needs {ref.k}")
    return _row(name, "fraction", key, ref.value, pass_at_k(row[CORRECT_COUNTS], samples, ref.k), step, note=note)


def _by_measure(frames: RunFrames, ref: Reference, name: str) -> dict:
    if ref.measures == "eval_avg":
        return _eval_avg(frames, ref, name)
    if ref.measures == "eval_pass_at_k":
        return _eval_pass_at_k(frames, ref, name)
    if ref.measures == "mean_abs_logprob_diff":
        per_step = abs_logprob_diff_by_step(frames)
        if per_step.empty:
            return _row(name, "kl", "rollout_corr/pos_*/abs_diff", ref.value, note=lacks("rollout_corr/pos_*/abs_diff"))
        return _row(name, "kl", "rollout_corr/pos_*/abs_diff", ref.value, float(per_step.mean()),
                    note=f"mean over {len(per_step)} steps")
    if ref.measures in ("reward_step_min", "reward_step_max"):
        if ACCURACY not in frames.train.columns or frames.train[ACCURACY].dropna().empty:
            return _row(name, "fraction", ACCURACY, ref.value, note=lacks(ACCURACY))
        ext = summary.step_extremes(frames.require(ACCURACY))
        which = "min" if ref.measures.endswith("min") else "max"
        return _row(name, "fraction", ACCURACY, ref.value, ext[which], ext[f"{which}_step"])
    column = KL if ref.measures == "kl" else K3_KL
    if column not in frames.train.columns or frames.train[column].dropna().empty:
        return _row(name, "kl", column, ref.value, note=lacks(column))
    values = frames.require(column)
    at = int(values.dropna().index[0]) if ref.at in (None, "first") else int(ref.at)
    step, value = summary.value_at_step(values, at)
    return _row(name, "kl", column, ref.value, value, step, note="" if step == at else f"step {at} not logged")


def metric_name(ref: Reference) -> str:
    what = {"eval_avg": "held-out pass@1 (avg@k)", "eval_pass_at_k": f"held-out pass@{ref.k}",
            "mean_abs_logprob_diff": "mean abs(Δ log p), train vs rollout", "reward_step_min": "reward, lowest step",
            "reward_step_max": "reward, highest step", "kl": "train-rollout KL, k1", "k3_kl": "train-rollout KL, k3"}
    where = "" if ref.at is None else (", first evaluation" if ref.at == "first" else f", step {ref.at}")
    if ref.measures in ("kl", "k3_kl") and ref.at == "first":
        where = ", first step"
    return what[ref.measures] + where


def compare_to_published(frames: RunFrames, reference: PublishedRun) -> pd.DataFrame:
    """One row per number ``reference`` published that a run's logs can give (its ``measures``), in
    ``repro.analysis.compare.COLUMNS`` (``amd`` holds the reference's value)."""
    rows = [_by_measure(frames, ref, metric_name(ref)) for ref in reference.metrics.values() if ref.measures]
    return pd.DataFrame(rows, columns=COLUMNS) if rows else pd.DataFrame(columns=COLUMNS).assign(amd=NAN)
