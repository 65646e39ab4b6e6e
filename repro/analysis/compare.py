"""This run beside AMD's published numbers, metric by metric, with an honest noise band for each.

Noise bands (what "inside" means):
  reward-accuracy phase means   the run's phase mean ± 1.96 · std(single steps) / sqrt(steps in the phase):
                                a 95% interval if steps were independent draws (they are correlated through
                                the policy, so this band is if anything too narrow). AMD's "about 45%" is itself
                                rounded to the percent, which the band does not include.
  held-out avg@k                the run's 95% percentile bootstrap interval over problems (10,000 resamples of
                                the 30 problems, seed 0); inside when AMD's value lies in it.
  throughput                    AMD's published single-step range 287-331 tok/s; inside when the run's value
                                lies in it. Only meaningful for a run on the same hardware: units are
                                generated tokens/s of the whole rollout group.
  single-step extremes, KL/ESS  AMD publishes no spread: "no band", inside is left empty.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from repro.analysis import summary
from repro.analysis.frame import ACCURACY, ESS, KL, THROUGHPUT, RunFrames
from repro.reference import amd_value

Z95 = 1.96
COLUMNS = ["metric", "amd", "run", "difference", "band_low", "band_high", "band", "inside", "note"]


def _row(metric, amd, run, band_low=math.nan, band_high=math.nan, band="no band", note="", inside_of="run"):
    """inside_of='run': AMD's value tested against the run's interval; 'amd': the run's value against AMD's."""
    inside = None
    if not (math.isnan(band_low) or math.isnan(band_high) or math.isnan(run)):
        probe = amd if inside_of == "run" else run
        inside = bool(band_low <= probe <= band_high)
    return {"metric": metric, "amd": amd, "run": run, "difference": run - amd, "band_low": band_low,
            "band_high": band_high, "band": band, "inside": inside, "note": note}


def _accuracy_rows(frames: RunFrames) -> list[dict]:
    if ACCURACY not in frames.train.columns:
        return []
    phases = summary.phase_means(frames.require(ACCURACY), 25)
    rows = []
    for phase in (1, 2, 3):
        amd = amd_value(f"reward_acc_phase{phase}")
        if phase not in phases.index:
            rows.append(_row(f"reward accuracy, steps {25 * phase - 24}-{25 * phase}", amd, math.nan,
                             note="run has no steps in this phase"))
            continue
        p = phases.loc[phase]
        half = Z95 * p["sem"]
        note = "" if p["steps"] == 25 else f"only {int(p['steps'])} of 25 steps logged"
        rows.append(_row(f"reward accuracy, steps {int(p['first_step'])}-{int(p['last_step'])}", amd, p["mean"],
                         p["mean"] - half, p["mean"] + half, "run mean ± 1.96·std/√n", note))
    ext = summary.step_extremes(frames.require(ACCURACY))
    rows.append(_row("reward accuracy, lowest single step", amd_value("reward_acc_step_min"), ext["min"],
                     note=f"step {ext['min_step']}"))
    rows.append(_row("reward accuracy, highest single step", amd_value("reward_acc_step_max"), ext["max"],
                     note=f"step {ext['max_step']}"))
    return rows


def _heldout_rows(frames: RunFrames) -> list[dict]:
    table = summary.eval_table(frames)
    if table.empty:
        return []
    first_step, last_step = int(table.index[0]), int(table.index[-1])
    rows = []
    for key, step, label in (("aime_avg8_start", first_step, "start"), ("aime_avg8_end", last_step, "end")):
        e = table.loc[step]
        band = "bootstrap 95% over problems" if e["problems"] else "no band (export has no per-problem counts)"
        rows.append(_row(f"held-out {frames.avg_key}, {label} (step {step})", amd_value(key), e["avg"],
                         e["low"], e["high"], band, f"{int(e['problems'])} problems" if e["problems"] else ""))
    return rows


def _throughput_rows(frames: RunFrames) -> list[dict]:
    if THROUGHPUT not in frames.train.columns:
        return []
    t = summary.throughput_summary(frames.require(THROUGHPUT))
    low, high = amd_value("rollout_tokens_per_s_min"), amd_value("rollout_tokens_per_s_max")
    hw = summary.hardware(frames)
    cpu = hw is not None and hw.gpus == 0
    note = "CPU run: other hardware, other model; not comparable" if cpu else ""
    rows = [_row(f"rollout tokens/s, {name}", amd_value(key), t[part], low, high, "AMD range 287-331", note, "amd")
            for name, key, part in (("mean", "rollout_tokens_per_s_mean", "mean"),
                                    ("first third", "rollout_tokens_per_s_first_third", "first_third"),
                                    ("last third", "rollout_tokens_per_s_last_third", "last_third"))]
    for row in rows if cpu else ():
        row["inside"] = None  # a CPU run's tokens/s landing in AMD's range would be a coincidence, not agreement
    amd_gpus = int(amd_value("rollout_gpus"))
    amd_per_gpu = summary.per_gpu_throughput(amd_value("rollout_tokens_per_s_mean"), amd_gpus)
    run_per_gpu = summary.per_gpu_throughput(t["mean"], hw.rollout_gpus) if hw and hw.rollout_gpus else math.nan
    rows.append(_row("rollout tokens/s per GPU, mean", amd_per_gpu, run_per_gpu,
                     note=f"AMD: aggregate of the {amd_gpus}-GPU rollout node / {amd_gpus}"
                     + ("" if hw and hw.rollout_gpus else "; run has no GPUs")))
    return rows


def _mismatch_rows(frames: RunFrames) -> list[dict]:
    rows = []
    for column, key, label in ((KL, "kl_train_rollout_step75", "train-rollout KL"),
                               (ESS, "ess_step75", "effective sample size")):
        if column in frames.train.columns:
            step, value = summary.value_at_step(frames.require(column), 75)
            note = f"{column}" + ("" if step == 75 else f"; run ends at step {step}")
            rows.append(_row(f"{label} at step {step}", amd_value(key), value, note=note))
    return rows


def compare_to_amd(frames: RunFrames) -> pd.DataFrame:
    """One row per published metric this run can be set against (rows are skipped where the run lacks the
    column). Fractions stay fractions (0.45, not 45)."""
    rows = _accuracy_rows(frames) + _heldout_rows(frames) + _throughput_rows(frames) + _mismatch_rows(frames)
    return pd.DataFrame(rows, columns=COLUMNS)


def _is_fraction(metric: str) -> bool:
    return metric.startswith(("reward accuracy", "held-out", "effective sample size"))


def _fmt(metric: str, value, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if _is_fraction(metric):
        return f"{value * 100:+.1f} pt" if signed else f"{value * 100:.1f}%"
    return f"{value:+.4g}" if signed else f"{value:.4g}"


def comparison_markdown(table: pd.DataFrame) -> str:
    lines = ["| metric | AMD | this run | difference | noise band | inside | note |", "|---|---|---|---|---|---|---|"]
    for r in table.itertuples(index=False):
        band = r.band if math.isnan(r.band_low) else f"{_fmt(r.metric, r.band_low)} – {_fmt(r.metric, r.band_high)} ({r.band})"
        inside = {True: "yes", False: "no", None: "—"}[r.inside]
        lines.append(f"| {r.metric} | {_fmt(r.metric, r.amd)} | {_fmt(r.metric, r.run)} | "
                     f"{_fmt(r.metric, r.difference, signed=True)} | {band} | {inside} | {r.note} |")
    return "\n".join(lines)


def _derived_markdown(frames: RunFrames) -> list[str]:
    if "timing_s/step" not in frames.train.columns:
        return ["No `timing_s/step` column: time-to-train cannot be derived."]
    t = summary.time_to_train(frames, steps=int(amd_value("steps")))
    lines = [f"- Mean step wall time: {t['step_s_mean']:.2f} s (median {t['step_s_median']:.2f} s) over "
             f"{int(t['steps_logged'])} logged steps; evaluation added {t['eval_s_total']:.1f} s in all.",
             f"- Wall time logged (steps + evals): {t['hours_logged']:.2f} h; "
             f"75 steps at the mean step time: {t['hours_for_steps']:.2f} h."]
    if "devices" in t:
        lines.append(f"- {t['unit']}: {t['device_hours_per_step']:.3g} per step, {t['device_hours_for_steps']:.3g} "
                     f"for 75 steps ({int(t['devices'])} {'GPUs' if t['unit'] == 'GPU-hours' else 'cores'}).")
        if t["unit"] == "core-hours":
            lines.append("  CPU recipes do not log a core count: the cores of the machine that ran this analysis "
                         "stand in for the run's, so core-hours are an estimate.")
    else:
        lines.append("- No recipe travels with an imported export: GPU-hours need a GPU count and are not given.")
    lines.append("- AMD does not publish step time or time-to-train (only the run's dates, Aug 17-21 2026, which "
                 "include setup), so there is no AMD figure to compare these with.")
    return lines


def _caveats(frames: RunFrames) -> list[str]:
    hw = summary.hardware(frames)
    out = []
    if hw is not None and hw.gpus == 0:
        out.append("**This is a tiny CPU run: a mechanism check, not a replication.** It exercises every part of "
                   "AMD's recipe (GRPO 32x8, FP8 rollout, TIS, R3, weight sync, avg@8 evaluation) on a ~2M-parameter "
                   "model and a synthetic arithmetic task, so its accuracies, KL, ESS and throughput measure a "
                   "different model on a different task on different hardware. Agreement or disagreement with AMD's "
                   "numbers says nothing about whether the 284B run reproduces.")
    out.append("AMD's phase means are given as \"about\"/\"roughly\" whole percents; their own step-to-step noise is not "
               "published, so a band is drawn from this run's data only. KL and ESS have no published spread.")
    return out


def render_report(frames: RunFrames) -> str:
    name = frames.recipe.name if frames.recipe else "imported export"
    parts = [f"# {name}: comparison with AMD's DeepSeek-V4-Flash RL run (24 x MI308X)", "",
             f"Source: `{frames.source}` — {len(frames.train)} training steps, {len(frames.eval)} evaluations.", "",
             *[f"> {c}\n" for c in _caveats(frames)],
             "## Metric by metric", "", comparison_markdown(compare_to_amd(frames)), "",
             "Noise bands: phase means use the run's single-step spread / √n (×1.96); held-out accuracy uses a "
             "bootstrap over problems (10,000 resamples, seed 0, 95% percentile interval) and asks whether AMD's value "
             "lies inside the run's interval; throughput asks whether the run lies inside AMD's published 287-331 range.",
             "", "## Derived figures the post does not give", "", *_derived_markdown(frames), ""]
    return "\n".join(parts)


def write_report(frames: RunFrames, path: str | Path) -> Path:
    """Write the Markdown report atomically (temp file + rename)."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp")
    tmp.write_text(render_report(frames))
    tmp.replace(final)
    return final
