"""Each source beside AMD's published numbers, metric by metric, with an honest noise band for each.

Every source gets the same rows, in the same order, so several sources line up in one table; a row whose key the
source lacks holds NaN and a note naming the key. ``step`` says which step a value comes from ("end" is the last
logged step when a run stopped before AMD's 75).

Noise bands (what "inside" means):
  reward-accuracy phase means   the run's phase mean ± 1.96 · std(single steps) / sqrt(steps in the phase):
                                a 95% interval if steps were independent draws (they are correlated through
                                the policy, so this band is if anything too narrow). AMD's "about 45%" is itself
                                rounded to the percent, which the band does not include.
  held-out avg@k                the run's 95% percentile bootstrap interval over problems (10,000 resamples of
                                the problems, seed 0); inside when AMD's value lies in it. Needs per-problem counts,
                                which only repro runs log.
  throughput                    AMD's published single-step range 287-331 tok/s; inside when the run's value
                                lies in it. Only meaningful on the same hardware: generated tokens/s of the whole
                                rollout group (not judged for a CPU run).
  single-step extremes, KL/ESS  AMD publishes no spread: "no band", inside is left empty.
"""

from __future__ import annotations

import math

import pandas as pd

from repro.analysis import summary
from repro.analysis.caveats import AMD_EVAL_STEPS, rollout_logprobs
from repro.analysis.frame import ACCURACY, ESS, K3_KL, KL, THROUGHPUT, RunFrames
from repro.metric_keys import EVAL_AVG_PREFIX, position_buckets, position_key
from repro.reference import amd_value

Z95 = 1.96
COLUMNS = ["metric", "quantity", "key", "step", "amd", "run", "difference", "band_low", "band_high", "band", "inside",
           "note"]
AMD_STEPS = 75
NAN = math.nan


def _row(metric, quantity, key, amd, run=NAN, step=None, band_low=NAN, band_high=NAN, band="no band", note="",
         inside_of="run"):
    """inside_of='run': AMD's value tested against the run's interval; 'amd': the run's value against AMD's."""
    inside = None
    if not any(math.isnan(x) for x in (band_low, band_high, run, amd)):
        probe = amd if inside_of == "run" else run
        inside = bool(band_low <= probe <= band_high)
    return {"metric": metric, "quantity": quantity, "key": key, "step": step, "amd": amd, "run": run,
            "difference": run - amd, "band_low": band_low, "band_high": band_high, "band": band, "inside": inside,
            "note": note}


def lacks(key: str) -> str:
    return f"no `{key}` in this source"


def _accuracy_rows(frames: RunFrames) -> list[dict]:
    phase_names = [f"reward accuracy, steps {25 * p - 24}-{25 * p}" for p in (1, 2, 3)]
    amd = [amd_value(f"reward_acc_phase{p}") for p in (1, 2, 3)]
    extremes = [("reward accuracy, lowest single step", "reward_acc_step_min"),
                ("reward accuracy, highest single step", "reward_acc_step_max")]
    if ACCURACY not in frames.train.columns or frames.train[ACCURACY].dropna().empty:
        return ([_row(n, "fraction", ACCURACY, a, note=lacks(ACCURACY)) for n, a in zip(phase_names, amd)]
                + [_row(n, "fraction", ACCURACY, amd_value(k), note=lacks(ACCURACY)) for n, k in extremes])
    phases = summary.phase_means(frames.require(ACCURACY), 25)
    rows = []
    for phase, name, amd_mean in zip((1, 2, 3), phase_names, amd):
        if phase not in phases.index:
            rows.append(_row(name, "fraction", ACCURACY, amd_mean, note="the run has no steps in this phase"))
            continue
        p = phases.loc[phase]
        half = Z95 * p["sem"]
        note = "" if p["steps"] == 25 else f"only {int(p['steps'])} of 25 steps logged"
        rows.append(_row(name, "fraction", ACCURACY, amd_mean, p["mean"], None, p["mean"] - half, p["mean"] + half,
                         "run mean ± 1.96·std/√n", note))
    ext = summary.step_extremes(frames.require(ACCURACY))
    rows.append(_row(extremes[0][0], "fraction", ACCURACY, amd_value(extremes[0][1]), ext["min"], ext["min_step"]))
    rows.append(_row(extremes[1][0], "fraction", ACCURACY, amd_value(extremes[1][1]), ext["max"], ext["max_step"]))
    return rows


def _heldout_rows(frames: RunFrames) -> list[dict]:
    key = frames.avg_key or f"{EVAL_AVG_PREFIX}k"
    names = ("held-out avg@k, start", "held-out avg@k, end")
    amd = (amd_value("aime_avg8_start"), amd_value("aime_avg8_end"))
    table = summary.eval_table(frames)
    if table.empty:
        return [_row(n, "fraction", key, a, note=lacks(key)) for n, a in zip(names, amd)]
    rows = []
    steps = (int(table.index[0]), int(table.index[-1]))
    if len(table) == 1:  # one evaluation is a start (by AMD's start step) or an end, never both
        only = steps[0]
        steps = (only, None) if only <= AMD_EVAL_STEPS[0] else (None, only)
    for name, amd_avg, step, amd_step in zip(names, amd, steps, AMD_EVAL_STEPS):
        if step is None:
            why = (f"no evaluation after step {steps[0]}" if amd_step == AMD_EVAL_STEPS[1]
                   else f"none by step {AMD_EVAL_STEPS[0]}, AMD's start (the evaluation after the first update)")
            rows.append(_row(name, "fraction", key, amd_avg, note=f"one evaluation only: {why}"))
            continue
        e = table.loc[step]
        notes = [f"{int(e['problems'])} problems"] if e["problems"] else ["no per-problem counts: no band"]
        if step != amd_step:
            notes.append(f"step {step}, AMD's is step {amd_step}")
        band = "bootstrap 95% over problems" if e["problems"] else "no band"
        rows.append(_row(name, "fraction", key, amd_avg, e["avg"], step, e["low"], e["high"], band, "; ".join(notes)))
    return rows


def _throughput_rows(frames: RunFrames) -> list[dict]:
    parts = (("rollout tokens/s, mean", "rollout_tokens_per_s_mean", "mean"),
             ("rollout tokens/s, first third", "rollout_tokens_per_s_first_third", "first_third"),
             ("rollout tokens/s, last third", "rollout_tokens_per_s_last_third", "last_third"))
    amd_gpus = int(amd_value("rollout_gpus"))
    amd_per_gpu = summary.per_gpu_throughput(amd_value("rollout_tokens_per_s_mean"), amd_gpus)
    per_gpu_name = "rollout tokens/s per GPU, mean"
    if THROUGHPUT not in frames.train.columns or frames.train[THROUGHPUT].dropna().empty:
        return ([_row(n, "tokens_per_s", THROUGHPUT, amd_value(k), note=lacks(THROUGHPUT)) for n, k, _ in parts]
                + [_row(per_gpu_name, "tokens_per_s", THROUGHPUT, amd_per_gpu, note=lacks(THROUGHPUT))])
    t = summary.throughput_summary(frames.require(THROUGHPUT))
    low, high = amd_value("rollout_tokens_per_s_min"), amd_value("rollout_tokens_per_s_max")
    hw = summary.hardware(frames)
    cpu = hw is not None and hw.gpus == 0
    note = "CPU run: other hardware, other model; not comparable" if cpu else ""
    rows = [_row(name, "tokens_per_s", THROUGHPUT, amd_value(key), t[part], None, low, high, "AMD range 287-331", note,
                 "amd") for name, key, part in parts]
    for row in rows if cpu else ():
        row["inside"] = None  # a CPU run's tokens/s landing in AMD's range would be a coincidence, not agreement
    if hw is not None and hw.rollout_gpus:
        rows.append(_row(per_gpu_name, "tokens_per_s", THROUGHPUT, amd_per_gpu,
                         summary.per_gpu_throughput(t["mean"], hw.rollout_gpus),
                         note=f"AMD: {amd_gpus}-GPU node / {amd_gpus}; run: / {hw.rollout_gpus} rollout GPUs"))
    else:
        why = "a CPU run has no GPUs" if cpu else "the log carries no GPU count"
        rows.append(_row(per_gpu_name, "tokens_per_s", THROUGHPUT, amd_per_gpu,
                         note=f"AMD: aggregate of the {amd_gpus}-GPU rollout node / {amd_gpus}; {why}"))
    return rows


LOGPROB_MARKS = {"processed": "processed rollout log-probs, AMD's were raw (T = 1): not the same quantity",
                 None: "the source does not say whether its rollout log-probs were raw, as AMD's, or processed"}


def _mismatch_rows(frames: RunFrames) -> list[dict]:
    specs = ((KL, "kl", "train-rollout KL, k1 estimator, end", amd_value("kl_train_rollout_step75"),
              "k1 can be negative"),
             (K3_KL, "kl", "train-rollout KL, k3 estimator, end", NAN,
              "k3 is never negative; AMD's 0.4706 is k1 (LumenRL's rollout_corr/kl), the row above"),
             (ESS, "fraction", "effective sample size, end", amd_value("ess_step75"), ""))
    mark = LOGPROB_MARKS.get(rollout_logprobs(frames), "")
    rows = []
    for column, quantity, metric, amd, note in specs:
        if column not in frames.train.columns or frames.train[column].dropna().empty:
            rows.append(_row(metric, quantity, column, amd, note="; ".join(filter(None, [lacks(column), note]))))
            continue
        step, value = summary.value_at_step(frames.require(column), AMD_STEPS)
        short = f"run ends at step {step}, AMD's value is at step {AMD_STEPS}" if step != AMD_STEPS else ""
        rows.append(_row(metric, quantity, column, amd, value, step,
                         note="; ".join(filter(None, [short, note, mark]))))
    return rows


def compare_positions(sources: list[RunFrames], stat: str = "kl", step: int = AMD_STEPS) -> pd.DataFrame:
    """LumenRL's mismatch by response position, one row per bucket and source: the source's ``stat`` at ``step`` (or
    its last logged step), NaN where it lacks the bucket, and a note that marks the cell where the value is missing
    or is not the quantity AMD's run logged (its rollout log-probs). AMD published none of these: no AMD column."""
    rows = []
    for frames in sources:
        mark = LOGPROB_MARKS.get(rollout_logprobs(frames), "")
        for start, end in position_buckets():
            key = position_key(start, end, stat)
            if key not in frames.train.columns or frames.train[key].dropna().empty:
                rows.append({"source": frames.label, "bucket": f"{start}-{end - 1}", "key": key, "step": None,
                             "value": NAN, "note": lacks(key)})
                continue
            at, value = summary.value_at_step(frames.require(key), step)
            short = f"not logged at step {step}: step {at}'s" if at != step else ""
            rows.append({"source": frames.label, "bucket": f"{start}-{end - 1}", "key": key, "step": at,
                         "value": value, "note": "; ".join(filter(None, [short, mark]))})
    return pd.DataFrame(rows, columns=["source", "bucket", "key", "step", "value", "note"])


def compare_to_amd(frames: RunFrames) -> pd.DataFrame:
    """One row per published metric (plus the k3 KL beside k1), the same rows for every source: a row whose key the
    source lacks holds NaN and says which key. Fractions stay fractions (0.45, not 45)."""
    rows = _accuracy_rows(frames) + _heldout_rows(frames) + _throughput_rows(frames) + _mismatch_rows(frames)
    return pd.DataFrame(rows, columns=COLUMNS)


def compare_sources(sources: list[RunFrames]) -> pd.DataFrame:
    """Several sources side by side: index metric, columns quantity, AMD, then one column of values per source
    label (NaN where the source lacks the metric). The long tables behind it: ``compare_to_amd`` per source."""
    tables = [compare_to_amd(frames).set_index("metric") for frames in sources]
    wide = tables[0][["quantity", "amd"]].rename(columns={"amd": "AMD"})
    for frames, table in zip(sources, tables):
        wide[frames.label] = table["run"]
    return wide
