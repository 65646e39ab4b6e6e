"""AMD's four charts regenerated from a run's frames, with AMD's published numbers drawn beside the run's own.

All styling lives in STYLE / the colour constants below; every figure is built inside ``styled()`` on the Agg
canvas (no pyplot, so no global figure registry and no GUI backend). Each plotting function takes RunFrames and
returns a Figure whose first line on each data axes is the run's per-step (or per-eval) series, unscaled:
fractions stay fractions and the axis formatter shows percent.
"""

from __future__ import annotations

import math
import os
import warnings
from contextlib import contextmanager
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from repro.analysis import summary
from repro.analysis.frame import ACCURACY, ESS, KL, THROUGHPUT, MetricsError, RunFrames, load_run
from repro.reference import amd_value

RUN_COLOUR = "#1f4e79"
RUN_SUMMARY_COLOUR = "#2e8b57"
AMD_COLOUR = "#ed1c24"  # AMD's brand red: everything AMD published is drawn in it
STYLE = {
    "figure.figsize": (8.0, 4.5),
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "savefig.bbox": "tight",
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "lines.linewidth": 1.2,
    "svg.hashsalt": "repro",  # stable SVG ids: the same frames give the same file
    "svg.fonttype": "path",
}
PNG_METADATA = {"Software": None}
SVG_METADATA = {"Date": None, "Creator": None}
FIGURE_NAMES = ("reward_accuracy", "heldout_accuracy", "rollout_throughput", "train_rollout_mismatch")


@contextmanager
def styled():
    with matplotlib.rc_context(STYLE):
        yield


def _new_figure(**subplots_kw) -> tuple[Figure, object]:
    fig = Figure()
    FigureCanvasAgg(fig)
    return fig, fig.subplots(**subplots_kw)


def _segments(rows, first="first_step", last="last_step", value="mean") -> tuple[np.ndarray, np.ndarray]:
    """Horizontal segments as one polyline broken by NaN: one artist however many phases (10,000-step logs)."""
    xs, ys = [], []
    for row in rows:
        xs += [row[first], row[last], math.nan]
        ys += [row[value], row[value], math.nan]
    return np.array(xs, dtype=float), np.array(ys, dtype=float)


def plot_reward_accuracy(frames: RunFrames, phase_len: int = 25) -> Figure:
    """Reward accuracy per step, 25-step phase means (run and AMD's ~45/53/59%), AMD's single-step range."""
    series = frames.require(ACCURACY)
    phases = summary.phase_means(series, phase_len)
    with styled():
        fig, ax = _new_figure()
        ax.plot(series.index, series.to_numpy(), color=RUN_COLOUR, alpha=0.6, label="this run, per step")
        ax.plot(*_segments(phases.to_dict("records")), color=RUN_SUMMARY_COLOUR, lw=2.5,
                label=f"this run, {phase_len}-step mean")
        amd = [{"first_step": s0, "last_step": s1, "mean": amd_value(f"reward_acc_phase{i}")}
               for i, (s0, s1) in enumerate(((1, 25), (26, 50), (51, 75)), start=1)]
        ax.plot(*_segments(amd), color=AMD_COLOUR, lw=2.5, ls="--", label="AMD, 25-step mean (≈45/53/59%)")
        for key in ("reward_acc_step_min", "reward_acc_step_max"):
            ax.axhline(amd_value(key), color=AMD_COLOUR, ls=":", lw=1,
                       label="AMD single-step range 26.6–77.7%" if key.endswith("min") else None)
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
        ax.set(xlabel="optimizer step", ylabel="reward accuracy", title="Training reward accuracy per step",
               ylim=(0, 1))
        ax.legend(loc="lower right")
    return fig


def plot_heldout_accuracy(frames: RunFrames) -> Figure:
    """Held-out avg@k per checkpoint with 95% bootstrap intervals over problems; AMD's 30.0% -> 49.2% on AIME."""
    table = summary.eval_table(frames)
    if table.empty:
        raise MetricsError(f"{frames.source}: no eval rows with eval/avg@k: no held-out figure")
    with styled():
        fig, ax = _new_figure()
        ax.plot(table.index, table["avg"].to_numpy(), "o-", color=RUN_COLOUR, label=f"this run, {frames.avg_key}")
        has_ci = table["low"].notna()
        if has_ci.any():
            ci = table[has_ci]
            ax.errorbar(ci.index, ci["avg"], yerr=[ci["avg"] - ci["low"], ci["high"] - ci["avg"]], fmt="none",
                        ecolor=RUN_COLOUR, capsize=4, label="95% bootstrap CI over problems")
        start, end = amd_value("aime_avg8_start"), amd_value("aime_avg8_end")
        ax.plot([0, int(amd_value("steps"))], [start, end], "s--", color=AMD_COLOUR,
                label="AMD, AIME-2024 avg@8 (30 problems): 30.0% → 49.2%")
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
        ax.set(xlabel="optimizer step", ylabel="avg@k", title="Held-out accuracy per checkpoint", ylim=(0, 1))
        ax.legend(loc="upper left")
    return fig


def plot_rollout_throughput(frames: RunFrames) -> Figure:
    """Rollout tokens/s per step with the means of each third; AMD's numbers in a side panel on their own axis
    (an 8-GPU node's aggregate), because a run on other hardware is in a different range and unit scale."""
    series = frames.require(THROUGHPUT)
    stats = summary.throughput_summary(series)
    parts = summary.thirds(series)
    with styled():
        fig, (ax, side) = _new_figure(ncols=2, gridspec_kw={"width_ratios": [4, 1]})
        ax.plot(series.index, series.to_numpy(), color=RUN_COLOUR, alpha=0.7, label="this run, per step")
        rows = [{"first_step": p.index[0], "last_step": p.index[-1], "mean": p.mean()} for p in parts if len(p)]
        ax.plot(*_segments(rows), color=RUN_SUMMARY_COLOUR, lw=2.5,
                label=f"this run, thirds: {stats['first_third']:.4g} / {stats['middle_third']:.4g} / "
                      f"{stats['last_third']:.4g}")
        ax.set(xlabel="optimizer step", ylabel="generated tokens/s (this run's rollout)",
               title="Rollout throughput per step")
        ax.legend(loc="lower left")

        low, high = amd_value("rollout_tokens_per_s_min"), amd_value("rollout_tokens_per_s_max")
        side.axhspan(low, high, color=AMD_COLOUR, alpha=0.12, label="range 287–331")
        side.plot([0, 1], [amd_value("rollout_tokens_per_s_first_third"), amd_value("rollout_tokens_per_s_last_third")],
                  "o-", color=AMD_COLOUR, label="first / last third")
        side.axhline(amd_value("rollout_tokens_per_s_mean"), color=AMD_COLOUR, ls="--", lw=1, label="mean 311")
        gpus = int(amd_value("rollout_gpus"))
        per_gpu = summary.per_gpu_throughput(amd_value("rollout_tokens_per_s_mean"), gpus)
        side.set(xticks=[0, 1], xticklabels=["1st ⅓", "last ⅓"], xlim=(-0.5, 1.5), ylim=(low - 15, high + 15),
                 title=f"AMD (published)\n{gpus}-GPU node aggregate\n= {per_gpu:.1f} tok/s per GPU")
        side.set_ylabel("AMD tokens/s")
        side.legend(loc="lower center")
    return fig


def plot_train_rollout_mismatch(frames: RunFrames) -> Figure:
    """Train-rollout KL and importance-sampling ESS per step, with AMD's step-75 values (0.4706, 79.1%)."""
    kl, ess = frames.require(KL), frames.require(ESS)
    with styled():
        fig, (ax_kl, ax_ess) = _new_figure(nrows=2, sharex=True)
        fig.set_size_inches(8.0, 6.0)
        ax_kl.plot(kl.index, kl.to_numpy(), color=RUN_COLOUR, label=f"this run ({KL})")
        ax_kl.plot([75], [amd_value("kl_train_rollout_step75")], "D", color=AMD_COLOUR, label="AMD, step 75: 0.4706")
        ax_kl.set(ylabel="KL(rollout ‖ trainer)", title="Training–rollout mismatch")
        ax_ess.plot(ess.index, ess.to_numpy(), color=RUN_COLOUR, label="this run (rollout IS eff. sample size)")
        ax_ess.plot([75], [amd_value("ess_step75")], "D", color=AMD_COLOUR, label="AMD, step 75: 79.1%")
        ax_ess.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
        ax_ess.set(xlabel="optimizer step", ylabel="effective sample size")
        for ax in (ax_kl, ax_ess):
            ax.legend(loc="best")
    return fig


FIGURES = dict(zip(FIGURE_NAMES, (plot_reward_accuracy, plot_heldout_accuracy, plot_rollout_throughput,
                                  plot_train_rollout_mismatch)))


def save_figure(fig: Figure, out_dir: str | Path, name: str) -> list[Path]:
    """Write NAME.png and NAME.svg; each goes to a temp file first and is renamed, so a reader never sees half."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with styled():
        for ext, metadata in (("png", PNG_METADATA), ("svg", SVG_METADATA)):
            final = out_dir / f"{name}.{ext}"
            tmp = out_dir / f".{name}.{ext}.tmp"
            try:
                fig.savefig(tmp, format=ext, metadata=metadata)
                os.replace(tmp, final)
            finally:
                tmp.unlink(missing_ok=True)
            written.append(final)
    return written


def make_all_figures(run_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Every figure the run's log has data for, as PNG + SVG; a figure without its columns is skipped with a
    warning naming what is missing (e.g. a run stopped before its first evaluation)."""
    frames = load_run(run_dir)
    written = []
    for name, plot in FIGURES.items():
        try:
            fig = plot(frames)
        except MetricsError as err:
            warnings.warn(f"figure {name} skipped: {err}", stacklevel=2)
            continue
        written += save_figure(fig, out_dir, name)
    return written
