"""Pure functions from frames/series to the numbers AMD's post quotes, plus the ones it leaves out.

Every function takes pandas objects and returns plain numbers or small frames; nothing here reads files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pandas as pd

from repro.analysis.frame import (ACCURACY, CORRECT_COUNTS, ESS, EVAL_SECONDS, K3_KL, KL, SAMPLES_PER_PROBLEM,
                                  STEP_SECONDS, MetricsError, RunFrames)
from repro.metric_keys import CHI2_SEQ, CHI2_TOKEN, IS_FRACTION_HIGH, position_buckets, position_key

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

    ``step_s`` is the mean of ``timing_s/step`` (rollout + reward + rescoring + update + sync). Our loop logs
    evaluation apart (``timing_s/eval``), added once per eval row actually run; verl and LumenRL time it inside the
    step (``frames.step_time_includes_eval``), so there only evaluations outside any step (verl's before the first
    update, at step 0) are added.
    """
    step_s = frames.require(STEP_SECONDS)
    mean_step = float(step_s.mean())
    has_eval_s = EVAL_SECONDS in frames.eval.columns
    eval_times = frames.eval[EVAL_SECONDS].fillna(0.0) if has_eval_s else pd.Series(dtype=float)
    eval_s = float(eval_times.sum())
    outside = ~eval_times.index.isin(step_s.index)
    added_eval_s = float(eval_times[outside].sum()) if frames.step_time_includes_eval else eval_s
    logged_h = (float(step_s.sum()) + added_eval_s) / 3600.0
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


def phase_table(sources: list[RunFrames], phase_len: int = 25, amd: dict[int, float] | None = None,
                column: str = ACCURACY) -> pd.DataFrame:
    """Phase means of ``column`` for several sources, one row per (source, phase): first/last step, steps logged,
    mean, std, sem, the 95% band mean ± 1.96·sem, and AMD's phase mean where ``amd`` gives one. A source without the
    column gets one row whose note names the key."""
    rows = []
    for frames in sources:
        if column not in frames.train.columns or frames.train[column].dropna().empty:
            rows.append({"source": frames.label, "note": f"no `{column}` in this source"})
            continue
        for phase, p in phase_means(frames.require(column), phase_len).iterrows():
            half = 1.96 * p["sem"]
            rows.append({"source": frames.label, "phase": int(phase), "first_step": int(p["first_step"]),
                         "last_step": int(p["last_step"]), "steps": int(p["steps"]), "mean": p["mean"], "std": p["std"],
                         "sem": p["sem"], "band_low": p["mean"] - half, "band_high": p["mean"] + half,
                         "amd": (amd or {}).get(int(phase), np.nan), "note": ""})
    columns = ["source", "phase", "first_step", "last_step", "steps", "mean", "std", "sem", "band_low", "band_high",
               "amd", "note"]
    return pd.DataFrame(rows, columns=columns)


# What each mismatch key estimates, said once for every table that shows them (LumenRL's keys: repro.analysis.caveats;
# its mismatch/* come from its FSDP loss only, never from the DeepSeek-V4 Megatron path).
MISMATCH_KEYS = {
    KL: ("kl", "k1: mean log π_rollout − log π_trainer; can be < 0"),
    K3_KL: ("kl", "k3: mean ρ − log ρ − 1, ρ = π_trainer/π_rollout; ≥ 0"),
    CHI2_TOKEN: ("kl", "χ² per token, E[ρ²] − 1; a sample estimate, can be < 0"),
    CHI2_SEQ: ("kl", "χ² per sequence, E[(Πρ)²] − 1; can be < 0"),
    ESS: ("fraction", "effective sample size of the truncated IS weights, 0–100%"),
    IS_FRACTION_HIGH: ("fraction", "share of tokens whose IS weight was truncated"),
    "mismatch/k3_kl": ("kl", "LumenRL FSDP loss: k3 on w = π_rollout/π_trainer, mean w − log w − 1; ≥ 0"),
    "mismatch/chi2_token": ("kl", "LumenRL FSDP loss: mean (w − 1)², w = π_rollout/π_trainer; ≥ 0"),
    "mismatch/abs_diff": ("kl", "LumenRL FSDP loss: mean |log π_rollout − log π_trainer|"),
}


def mismatch_summary(frames: RunFrames) -> pd.DataFrame:
    """The mismatch keys this source logs: what each estimates, its quantity, mean, min, max, and the value at the
    last logged step (index: the key)."""
    rows = {}
    for key, (quantity, what) in MISMATCH_KEYS.items():
        if key in frames.train.columns and frames.train[key].notna().any():
            values = frames.require(key)
            rows[key] = {"estimates": what, "quantity": quantity, "mean": float(values.mean()),
                         "min": float(values.min()), "max": float(values.max()), "last_step": int(values.index[-1]),
                         "last": float(values.iloc[-1])}
    return pd.DataFrame.from_dict(rows, orient="index",
                                  columns=["estimates", "quantity", "mean", "min", "max", "last_step", "last"])


def mismatch_by_position(frames: RunFrames, first_step: int | None = None,
                         last_step: int | None = None) -> pd.DataFrame:
    """LumenRL's per-position mismatch buckets (``rollout_corr/pos_*``) over a span of steps: one row per bucket
    that has tokens (index: "start–end"), with the steps and tokens it holds and the token-weighted means of k1
    (``kl``), k3 (``k3_kl``) and |Δ| (``abs_diff``) over those steps -- each step's bucket mean weighted by its
    token count, so the figure equals the mean over every token of the span. Raises MetricsError when the source
    logs no bucket (LumenRL before 2232f55, verl, or a repro run made before the buckets were logged)."""
    train = frames.train.loc[first_step:last_step]
    rows = {}
    for start, end in position_buckets():
        tokens_key = position_key(start, end, "tokens")
        if tokens_key not in train.columns:
            continue
        tokens = train[tokens_key].fillna(0.0)
        if float(tokens.sum()) == 0:
            continue
        row = {"steps": int((tokens > 0).sum()), "tokens": float(tokens.sum())}
        for stat in ("kl", "k3_kl", "abs_diff"):
            values = train.get(position_key(start, end, stat))
            row[stat] = float((values.fillna(0.0) * tokens).sum() / tokens.sum()) if values is not None else np.nan
        rows[f"{start}–{end - 1}"] = row
    if not rows:
        raise MetricsError(f"{frames.label}: no rollout_corr/pos_* keys (LumenRL logs them since 2232f55)")
    table = pd.DataFrame.from_dict(rows, orient="index", columns=["steps", "tokens", "kl", "k3_kl", "abs_diff"])
    table.index.name = "response position"
    return table


# the mismatch at the end of the run (notebook 13): row label of its table, metric, short name in its results
END_MISMATCH = (("KL, k1 estimator (can be < 0)", KL, "kl"), ("KL, k3 estimator (≥ 0)", K3_KL, "k3"),
                ("effective sample size", ESS, "ess"))


def mismatch_at_step(frames: RunFrames, step: int = 75) -> dict[str, tuple[int, float] | tuple[None, None]]:
    """Short name ('kl', 'k3', 'ess') -> (step, value) at ``step`` (or the last logged step); (None, None) where the
    source logs no value of it."""
    train = frames.train
    return {short: value_at_step(frames.require(key), step) if key in train.columns and train[key].notna().any()
            else (None, None) for _, key, short in END_MISMATCH}


def mismatch_at_end_table(runs: list[RunFrames], amd: dict[str, float], step: int = 75) -> pd.DataFrame:
    """Rows: each END_MISMATCH quantity and the step it was read at; columns: each source, then AMD's (``amd``: short
    name -> AMD's value at step 75)."""
    columns = {}
    for frames in runs:
        values = {}
        for (row, _, short), (at, value) in zip(END_MISMATCH, mismatch_at_step(frames, step).values()):
            if at is not None:
                values[row], values[f"{row}: at step"] = value, at
        columns[frames.label] = values
    columns["AMD"] = {f"{row}{suffix}": value for row, _, short in END_MISMATCH if short in amd
                      for suffix, value in (("", amd[short]), (": at step", 75))}
    return pd.DataFrame(columns)


def mismatch_at_end_results(runs: list[RunFrames], step: int = 75) -> dict[str, dict]:
    """The recorded results of notebook 13's end-of-run mismatch: ``<short>_step`` and ``<short>`` per source
    (None where not logged), and the run means of KL and ESS."""
    at = {frames.label: mismatch_at_step(frames, step) for frames in runs}
    results: dict[str, dict] = {}
    for _, _, short in END_MISMATCH:
        results[f"{short}_step"] = {label: values[short][0] for label, values in at.items()}
        results[short] = {label: values[short][1] for label, values in at.items()}
    results["kl_mean"] = {f.label: float(f.train[KL].mean()) for f in runs if KL in f.train.columns}
    results["ess_mean"] = {f.label: float(f.train[ESS].mean()) for f in runs if ESS in f.train.columns}
    return results


def mismatch_quantities(table: pd.DataFrame) -> dict[str, str]:
    """How ``formatted_rows`` shows each row of ``mismatch_at_end_table``: steps, the ESS fraction, KL values."""
    return {row: "step" if row.endswith("at step") else "fraction" if row.startswith("effective") else "kl"
            for row in table.index}
