"""Pure functions from frames/series to the numbers AMD's post quotes, plus the ones it leaves out.

Every function takes pandas objects and returns plain numbers or small frames; nothing here reads files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pandas as pd

from repro.analysis.frame import (CORRECT_COUNTS, EVAL_SECONDS, SAMPLES_PER_PROBLEM, STEP_SECONDS, MetricsError,
                                  RunFrames)

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95


def phase_means(series: pd.Series, phase_len: int = 25) -> pd.DataFrame:
    """Means over consecutive phases of ``phase_len`` steps, by step number: phase 1 is steps 1..phase_len.

    Returns one row per phase (index ``phase``, 1-based) with first_step, last_step, steps (how many were
    logged), mean, std (of single steps) and sem = std / sqrt(steps): the noise of the phase mean if steps
    were independent draws around it.
    """
    values = series.dropna()
    if values.empty:
        raise MetricsError(f"{series.name}: no values to average")
    phase = (values.index.to_numpy() - 1) // phase_len + 1
    grouped = values.groupby(phase)
    table = pd.DataFrame({
        "first_step": (grouped.size().index - 1) * phase_len + 1,
        "last_step": grouped.size().index * phase_len,
        "steps": grouped.size(),
        "mean": grouped.mean(),
        "std": grouped.std(ddof=1),
    })
    table["sem"] = table["std"] / np.sqrt(table["steps"])
    table.index.name = "phase"
    return table


def step_extremes(series: pd.Series) -> dict[str, float]:
    """Lowest and highest single-step value, and the steps they came from."""
    values = series.dropna()
    return {"min": float(values.min()), "min_step": int(values.idxmin()),
            "max": float(values.max()), "max_step": int(values.idxmax())}


def thirds(series: pd.Series) -> list[pd.Series]:
    """The run split into three consecutive parts of (nearly) equal step count, as "first third of the run"."""
    values = series.dropna().sort_index()
    return [values.iloc[part] for part in np.array_split(np.arange(len(values)), 3)]


def throughput_summary(series: pd.Series) -> dict[str, float]:
    """mean/min/max over steps and the mean of each third (AMD: 311 in 287..331, 315.2 first third, 308.6 last)."""
    values = series.dropna()
    if values.empty:
        raise MetricsError(f"{series.name}: no throughput values")
    first, middle, last = (float(part.mean()) if len(part) else float("nan") for part in thirds(values))
    return {"mean": float(values.mean()), "min": float(values.min()), "max": float(values.max()),
            "first_third": first, "middle_third": middle, "last_third": last}


def value_at_step(series: pd.Series, step: int | None = None) -> tuple[int, float]:
    """(step, value) at ``step``, or at the last logged step when ``step`` is None or was not logged."""
    values = series.dropna()
    if values.empty:
        raise MetricsError(f"{series.name}: no values")
    if step is not None and step in values.index:
        return step, float(values.loc[step])
    return int(values.index[-1]), float(values.iloc[-1])


def bootstrap_avg_ci(correct_counts, samples_per_problem: int, resamples: int = BOOTSTRAP_RESAMPLES,
                     seed: int = BOOTSTRAP_SEED, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """avg@k and its percentile bootstrap interval over problems.

    The problems are the unit of sampling (AIME has 30; a different 30 would score differently), so each
    resample draws len(counts) problems with replacement and recomputes avg@k. Returns (avg, low, high).
    """
    counts = np.asarray(correct_counts, dtype=np.float64)
    if counts.ndim != 1 or counts.size == 0:
        raise MetricsError(f"eval/correct_counts: expected a non-empty list of counts, got shape {counts.shape}")
    rates = counts / samples_per_problem
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, rates.size, size=(resamples, rates.size))
    means = rates[picks].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(rates.mean()), float(low), float(high)


def eval_table(frames: RunFrames, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> pd.DataFrame:
    """avg@k per eval step with its bootstrap interval (columns avg, low, high, problems); empty if no evals."""
    key = frames.avg_key
    if key is None:
        return pd.DataFrame(columns=["avg", "low", "high", "problems"], index=pd.Index([], name="step"))
    rows = {}
    for step, row in frames.eval.iterrows():
        counts = row.get(CORRECT_COUNTS)
        k = row.get(SAMPLES_PER_PROBLEM, int(key.split("@")[1]))
        if isinstance(counts, (list, np.ndarray)) and len(counts):
            avg, low, high = bootstrap_avg_ci(counts, int(k), resamples, seed)
            rows[step] = (float(row[key]), low, high, len(counts))
        else:  # an imported export carries only the average: no interval can be drawn
            rows[step] = (float(row[key]), float("nan"), float("nan"), 0)
    table = pd.DataFrame.from_dict(rows, orient="index", columns=["avg", "low", "high", "problems"])
    table.index.name = "step"
    return table


@dataclass(frozen=True)
class Hardware:
    """What a run ran on, from its recipe: ``gpus`` 0 means CPU mode, where ``cores`` is what is counted."""

    gpus: int
    rollout_gpus: int
    cores: int | None = None

    @property
    def label(self) -> str:
        return f"{self.gpus} GPUs" if self.gpus else "CPU"


def hardware(frames: RunFrames, cores: int | None = None) -> Hardware | None:
    """GPU counts from the recipe (cluster.num_nodes x gpus_per_node). CPU recipes log no core count, so the
    cores of the machine doing the analysis stand in unless ``cores`` is given (the report says so)."""
    recipe = frames.recipe
    if recipe is None:
        return None
    gpus = recipe.cluster.num_nodes * recipe.cluster.gpus_per_node
    rollout_gpus = recipe.rollout.num_replicas * recipe.rollout.tensor_parallel if gpus else 0
    return Hardware(gpus, rollout_gpus, None if gpus else (cores or os.cpu_count() or 1))


def time_to_train(frames: RunFrames, steps: int = 75, cores: int | None = None) -> dict[str, float | str]:
    """Wall time per step and for ``steps`` steps, and device-hours: GPU-hours on a cluster, core-hours on CPU.

    ``step_s`` is the mean of ``timing_s/step`` (rollout + reward + rescoring + update + sync); evaluation is
    logged separately (``timing_s/eval``) and added once per eval row actually run.
    """
    step_s = frames.require(STEP_SECONDS)
    mean_step = float(step_s.mean())
    eval_s = float(frames.eval[EVAL_SECONDS].sum()) if EVAL_SECONDS in frames.eval.columns else 0.0
    logged_h = (float(step_s.sum()) + eval_s) / 3600.0
    out: dict[str, float | str] = {
        "steps_logged": float(len(step_s)), "step_s_mean": mean_step, "step_s_median": float(step_s.median()),
        "eval_s_total": eval_s, "hours_logged": logged_h, "hours_for_steps": mean_step * steps / 3600.0,
        "steps": float(steps),
    }
    hw = hardware(frames, cores)
    if hw is None:
        out["unit"] = "unknown (no recipe)"
        return out
    count, unit = (hw.gpus, "GPU-hours") if hw.gpus else (hw.cores, "core-hours")
    out.update({"unit": unit, "devices": float(count), "device_hours_per_step": mean_step * count / 3600.0,
                "device_hours_for_steps": mean_step * steps * count / 3600.0, "device_hours_logged": logged_h * count})
    return out


def per_gpu_throughput(aggregate_tokens_per_s: float, gpus: int) -> float:
    """AMD's 311 tok/s is the whole 8-GPU rollout node's output: 311 / 8 = 38.9 tok/s per GPU."""
    if gpus <= 0:
        raise MetricsError("per-GPU throughput needs a GPU count above 0 (a CPU run has none)")
    return aggregate_tokens_per_s / gpus
