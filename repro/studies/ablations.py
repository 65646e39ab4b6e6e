"""The ablations AMD did not publish: R3 on/off, TIS token/sequence/off, cap 2.0/1.5/5.0, the rollout's log-prob
convention and dual-clip -- run, summarised, and
compared with seed noise.

Each arm is the tiny recipe with one change (``ARMS``), run for a shortened step count with several seeds into
``<out_dir>/<arm>/seed<N>/`` by the one entry point (``repro.engines.run_recipe``), and read back through the
same sources as every analysis notebook (``repro.analysis.sources``). Per run: reward accuracy by phase, held-out
avg@k at the last evaluation with its bootstrap band over problems, the mean k1/k3 KL, ESS and share of tokens above
the cap, and the median step time. Per arm: the mean over seeds and the seed range [min, max]. A difference from the
baseline "exceeds seed noise" when the two arms' seed ranges do not overlap -- with two seeds a coarse test, stated
as such, not a significance level.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from repro.analysis.frame import ACCURACY, ESS, K3_KL, KL, STEP_SECONDS, MetricsError, RunFrames
from repro.analysis.summary import eval_table, phase_means
from repro.metric_keys import IS_FRACTION_HIGH
from repro.recipes import load_recipe


@dataclass(frozen=True)
class Arm:
    name: str
    overrides: tuple[str, ...]
    what: str


BASELINE = "baseline"
ARMS = (
    Arm(BASELINE, (), "the tiny recipe: R3 on, token TIS capped at 2.0, raw rollout log-probs, no dual-clip (AMD's)"),
    Arm("r3-off", ("routing_replay.enabled=false",), "the trainer routes tokens itself"),
    Arm("tis-sequence", ("rollout_correction.mode=sequence",), "one weight per sequence, min(prod rho, 2.0)"),
    Arm("tis-off", ("rollout_correction.mode=none",), "no importance weights"),
    Arm("cap-1.5", ("rollout_correction.threshold=1.5",), "token TIS capped at 1.5"),
    Arm("cap-5.0", ("rollout_correction.threshold=5.0",), "token TIS capped at 5.0"),
    Arm("processed-logprobs", ("rollout.logprobs_mode=processed",),
        "the rollout reports log_softmax(z / T), the distribution it sampled (vLLM processed_logprobs)"),
    Arm("dual-clip", ("algorithm.clip_ratio_c=3.0",), "verl's dual-clip: negative-advantage losses capped at 3|A|"),
)
ARM_NAMES = tuple(arm.name for arm in ARMS)

# per-run quantities: column -> (label, quantity for repro.analysis.formats)
QUANTITIES = {
    "avg_end": ("held-out avg@k, last eval", "fraction"),
    "kl": ("k1 KL, mean over steps", "kl"),
    "k3_kl": ("k3 KL, mean over steps", "kl"),
    "ess": ("ESS, mean over steps", "fraction"),
    "above_cap": ("tokens above the cap, mean", "fraction"),
    "step_s": ("step time, median (s)", "seconds"),
}


def arm_by_name(name: str) -> Arm:
    for arm in ARMS:
        if arm.name == name:
            return arm
    raise ValueError(f"unknown ablation arm {name!r}; the arms are: {', '.join(ARM_NAMES)}")


def arm_overrides(arm: Arm, seed: int, steps: int, eval_every: int) -> list[str]:
    """The ``--set`` overrides of one (arm, seed) run: the arm's change, the seed, the shortened schedule."""
    return [*arm.overrides, f"seed={seed}", f"steps={steps}", f"eval.every_steps={eval_every}",
            f"checkpoint.every_steps={steps}"]


def run_dir_of(out_dir: str | Path, arm: str, seed: int) -> Path:
    return Path(out_dir) / arm / f"seed{seed}"


def run_ablations(out_dir: str | Path, arms=ARM_NAMES, seeds=(0, 1), steps: int = 30, eval_every: int = 10,
                  recipe: str = "tiny-cpu", in_process: bool = True, say=print) -> list[Path]:
    """Run every (arm, seed) not already complete in ``out_dir`` (a finished one is left as it is: resume)."""
    from repro.engines import run_recipe  # torch + transformers: only to run the arms, not to summarise them

    dirs = []
    for name in arms:
        arm = arm_by_name(name)
        for seed in seeds:
            run_dir = run_dir_of(out_dir, arm.name, seed)
            loaded = load_recipe(recipe, arm_overrides(arm, seed, steps, eval_every))
            say(f"{arm.name} seed {seed}: {arm.what}")
            run_recipe(loaded, run_dir, in_process=in_process, resume="auto", say=lambda line: None)
            dirs.append(run_dir)
    return dirs


def _mean(frames: RunFrames, key: str) -> float:
    return float(frames.train[key].mean()) if key in frames.train.columns else float("nan")


def run_summary(frames: RunFrames, phase_len: int) -> dict:
    """One run's numbers (see the module docstring); phases are ``phase_len`` steps long."""
    row = {f"phase{int(p)}": float(v) for p, v in phase_means(frames.require(ACCURACY), phase_len)["mean"].items()}
    evals = eval_table(frames)
    if evals.empty:
        raise MetricsError(f"{frames.source}: no evaluation rows (the ablation reads the held-out avg@k)")
    last = evals.iloc[-1]
    row.update({"avg_start": float(evals.iloc[0]["avg"]), "avg_end": float(last["avg"]),
                "avg_end_low": float(last["low"]), "avg_end_high": float(last["high"]),
                "eval_step": int(evals.index[-1]),
                "kl": _mean(frames, KL), "k3_kl": _mean(frames, K3_KL), "ess": _mean(frames, ESS),
                "above_cap": _mean(frames, IS_FRACTION_HIGH),
                "step_s": float(frames.require(STEP_SECONDS).median())})
    return row


def runs_table(runs: dict[tuple[str, int], RunFrames], phase_len: int) -> pd.DataFrame:
    """One row per (arm, seed): ``run_summary`` of each run."""
    rows = [{"arm": arm, "seed": seed, **run_summary(frames, phase_len)} for (arm, seed), frames in runs.items()]
    return pd.DataFrame(rows).sort_values(["arm", "seed"], key=lambda c: c.map(_arm_order) if c.name == "arm" else c,
                                          ignore_index=True)


def _arm_order(name: str) -> int:
    return ARM_NAMES.index(name) if name in ARM_NAMES else len(ARM_NAMES)


def metric_columns(table: pd.DataFrame) -> list[str]:
    phases = sorted((c for c in table.columns if c.startswith("phase")), key=lambda c: int(c[5:]))
    return phases + [c for c in QUANTITIES if c in table.columns]


def arm_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per arm and metric: seeds, mean over seeds, seed range (min, max). Long format, one row per (arm, metric)."""
    rows = []
    for arm, group in table.groupby("arm", sort=False):
        for metric in metric_columns(table):
            values = group[metric].dropna()
            rows.append({"arm": arm, "metric": metric, "seeds": len(values), "mean": float(values.mean()),
                         "seed_min": float(values.min()), "seed_max": float(values.max())})
    return pd.DataFrame(rows)


def versus_baseline(arms: pd.DataFrame, baseline: str = BASELINE) -> pd.DataFrame:
    """Each arm's mean minus the baseline's, per metric, and whether the seed ranges are disjoint."""
    base = arms[arms["arm"] == baseline].set_index("metric")
    if base.empty:
        raise MetricsError(f"no {baseline!r} arm among {sorted(set(arms['arm']))}: nothing to compare with")
    rows = []
    for _, row in arms[arms["arm"] != baseline].iterrows():
        b = base.loc[row["metric"]]
        disjoint = row["seed_min"] > b["seed_max"] or row["seed_max"] < b["seed_min"]
        rows.append({"arm": row["arm"], "metric": row["metric"], "arm_mean": row["mean"], "baseline_mean": b["mean"],
                     "difference": row["mean"] - b["mean"], "exceeds_seed_noise": bool(disjoint and row["seeds"] > 1
                                                                                       and b["seeds"] > 1)})
    return pd.DataFrame(rows)


def findings(diffs: pd.DataFrame) -> list[str]:
    """Sentences for the differences whose seed ranges do not overlap; one saying so when none do."""
    hits = diffs[diffs["exceeds_seed_noise"]]
    if hits.empty:
        return ["No arm differs from the baseline beyond seed noise on any metric (every seed range overlaps)."]
    return [f"{r.arm}: {r.metric} {r.arm_mean:.4g} vs baseline {r.baseline_mean:.4g} ({r.difference:+.3g}); "
            f"the seed ranges do not overlap" for r in hits.itertuples()]


def band_width(table: pd.DataFrame, metric: str) -> float:
    """The widest seed range of ``metric`` over the arms: how far two seeds of one setting can land apart."""
    spans = table.groupby("arm")[metric].agg(lambda v: float(np.max(v) - np.min(v)))
    return float(spans.max())
