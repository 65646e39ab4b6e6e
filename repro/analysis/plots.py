"""AMD's four charts regenerated from one or several sources' frames, AMD's published numbers drawn beside them.

All styling lives in STYLE / the colour constants below; every figure is built inside ``styled()`` on the Agg
canvas (no pyplot, so no global figure registry and no GUI backend). Each plotting function takes RunFrames or a list
of them (an own cluster run, the tiny run; R3 on and off ...) and overlays the sources in order, each in its own
colour, labelled with the source's label; the first line on each data axes is the first source's per-step (or
per-eval) series, unscaled: fractions stay fractions and the axis formatter shows percent. A source that lacks a
figure's column is left out with a line under the figure naming the key; a figure none can draw raises MetricsError.
"""

from __future__ import annotations

import io
import math
import os
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from repro.analysis import summary
from repro.analysis.frame import ACCURACY, ESS, K3_KL, KL, THROUGHPUT, MetricsError, RunFrames
from repro.analysis.sources import load_sources
from repro.metric_keys import position_buckets
from repro.reference import amd_reference, amd_value

RUN_COLOUR = "#1f4e79"
RUN_SUMMARY_COLOUR = "#2e8b57"
AMD_COLOUR = "#ed1c24"  # AMD's brand red: everything AMD published is drawn in it, and no source is
SOURCE_COLOURS = ("#1f4e79", "#2e8b57", "#7b3f99", "#d98c00", "#008b8b", "#6b6b6b")  # several sources, in order
LUMENRL_K3 = "mismatch/k3_kl"  # LumenRL's k3, on π_rollout/π_trainer; its FSDP loss only (repro.analysis.caveats)
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
Sources = RunFrames | Sequence[RunFrames]


@contextmanager
def styled():
    with matplotlib.rc_context(STYLE):
        yield


def new_figure(**subplots_kw) -> tuple[Figure, object]:
    fig = Figure()
    FigureCanvasAgg(fig)
    return fig, fig.subplots(**subplots_kw)


def _as_list(sources: Sources) -> list[RunFrames]:
    return [sources] if isinstance(sources, RunFrames) else list(sources)


def _colours(sources: list[RunFrames]) -> list[tuple[str, str]]:
    """(per-step colour, summary colour) per source: one source keeps the two-colour look, several get one each."""
    if len(sources) == 1:
        return [(RUN_COLOUR, RUN_SUMMARY_COLOUR)]
    return [(SOURCE_COLOURS[i % len(SOURCE_COLOURS)],) * 2 for i in range(len(sources))]


def _having(sources: list[RunFrames], fig: Figure, figure: str, has) -> list[tuple[int, RunFrames]]:
    """The sources that can be drawn (``has(frames)`` is None) with their index; the others are named under the
    figure with the key they lack. Raises when none can."""
    drawn, missing = [], []
    for i, frames in enumerate(sources):
        lacking = has(frames)
        if lacking:
            missing.append(f"{frames.label} (no {lacking})")
        else:
            drawn.append((i, frames))
    if not drawn:
        raise MetricsError(f"{figure}: no source has the data: {'; '.join(missing)}")
    if missing:
        fig.text(0.01, -0.02, "not shown: " + "; ".join(missing), fontsize=8, ha="left", va="top")
    return drawn


def _legend(ax, sources: list[RunFrames], loc: str) -> None:
    """One source: the legend inside at ``loc``; several: outside on the right, where it hides no curve."""
    if len(sources) == 1:
        ax.legend(loc=loc)
    else:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _lacks(column: str, frame: str = "train"):
    def check(frames: RunFrames) -> str | None:
        table = frames.train if frame == "train" else frames.eval
        return None if column in table.columns and table[column].notna().any() else column
    return check


def _segments(rows, first="first_step", last="last_step", value="mean") -> tuple[np.ndarray, np.ndarray]:
    """Horizontal segments as one polyline broken by NaN: one artist however many phases (10,000-step logs)."""
    xs, ys = [], []
    for row in rows:
        xs += [row[first], row[last], math.nan]
        ys += [row[value], row[value], math.nan]
    return np.array(xs, dtype=float), np.array(ys, dtype=float)


def plot_reward_accuracy(sources: Sources, phase_len: int = 25) -> Figure:
    """Reward accuracy per step and its 25-step phase means for each source, AMD's ~45/53/59% and single-step range."""
    sources = _as_list(sources)
    with styled():
        fig, ax = new_figure()
        for i, frames in _having(sources, fig, "reward accuracy", _lacks(ACCURACY)):
            step_colour, mean_colour = _colours(sources)[i]
            series = frames.require(ACCURACY)
            phases = summary.phase_means(series, phase_len)
            ax.plot(series.index, series.to_numpy(), color=step_colour, alpha=0.6, label=f"{frames.label}, per step")
            ax.plot(*_segments(phases.to_dict("records")), color=mean_colour, lw=2.5,
                    label=f"{frames.label}, {phase_len}-step mean")
        amd = [{"first_step": s0, "last_step": s1, "mean": amd_value(f"reward_acc_phase{i}")}
               for i, (s0, s1) in enumerate(((1, 25), (26, 50), (51, 75)), start=1)]
        ax.plot(*_segments(amd), color=AMD_COLOUR, lw=2.5, ls="--", label="AMD, 25-step mean (≈45/53/59%)")
        for key in ("reward_acc_step_min", "reward_acc_step_max"):
            ax.axhline(amd_value(key), color=AMD_COLOUR, ls=":", lw=1,
                       label="AMD single-step range 26.6–77.7%" if key.endswith("min") else None)
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
        ax.set(xlabel="optimizer step", ylabel="reward accuracy", title="Training reward accuracy per step",
               ylim=(0, 1))
        _legend(ax, sources, "lower right")
    return fig


def plot_heldout_accuracy(sources: Sources) -> Figure:
    """Held-out avg@k per evaluation for each source, with 95% bootstrap intervals over problems where the source
    logs per-problem counts; AMD's 30.0% (after step 1) and 49.2% (step 75) on AIME, as two unjoined points."""
    sources = _as_list(sources)
    with styled():
        fig, ax = new_figure()
        for i, frames in _having(sources, fig, "held-out accuracy", lambda f: None if f.avg_key else "eval/avg@k"):
            colour = _colours(sources)[i][0]
            table = summary.eval_table(frames)
            ax.plot(table.index, table["avg"].to_numpy(), "o-", color=colour, label=f"{frames.label}, {frames.avg_key}")
            ci = table[table["low"].notna()]
            if len(ci):
                ax.errorbar(ci.index, ci["avg"], yerr=[ci["avg"] - ci["low"], ci["high"] - ci["avg"]], fmt="none",
                            ecolor=colour, capsize=4, label=f"{frames.label}, 95% bootstrap CI over problems")
        # AMD's two published points, unjoined: a line between them would draw evaluations nobody published
        start, end = amd_reference()["aime_avg8_start"], amd_reference()["aime_avg8_end"]
        ax.plot([start.step, end.step], [start.value, end.value], "s", color=AMD_COLOUR,
                label=f"AMD, AIME-2024 avg@8 (30 problems): 30.0% after step {start.step} → 49.2% at step {end.step}")
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
        ax.set(xlabel="optimizer step", ylabel="avg@k", title="Held-out accuracy per checkpoint", ylim=(0, 1))
        _legend(ax, sources, "upper left")
    return fig


def plot_rollout_throughput(sources: Sources) -> Figure:
    """Rollout tokens/s per step with the means of each third for each source; AMD's numbers in a side panel on
    their own axis (an 8-GPU node's aggregate), because a run on other hardware is in a different range."""
    sources = _as_list(sources)
    with styled():
        fig, (ax, side) = new_figure(ncols=2, gridspec_kw={"width_ratios": [4, 1]})
        for i, frames in _having(sources, fig, "rollout throughput", _lacks(THROUGHPUT)):
            step_colour, mean_colour = _colours(sources)[i]
            series = frames.require(THROUGHPUT)
            stats = summary.throughput_summary(series)
            ax.plot(series.index, series.to_numpy(), color=step_colour, alpha=0.7, label=f"{frames.label}, per step")
            rows = [{"first_step": p.index[0], "last_step": p.index[-1], "mean": p.mean()}
                    for p in summary.thirds(series) if len(p)]
            ax.plot(*_segments(rows), color=mean_colour, lw=2.5,
                    label=f"{frames.label}, thirds: {stats['first_third']:.1f} / {stats['middle_third']:.1f} / "
                          f"{stats['last_third']:.1f}")
        ax.set(xlabel="optimizer step", ylabel="generated tokens/s (whole rollout group)",
               title="Rollout throughput per step")
        ax.legend(loc="lower left" if len(sources) == 1 else "best")

        low, high = amd_value("rollout_tokens_per_s_min"), amd_value("rollout_tokens_per_s_max")
        side.axhspan(low, high, color=AMD_COLOUR, alpha=0.12, label="range 287–331")
        side.plot([0, 1], [amd_value("rollout_tokens_per_s_first_third"), amd_value("rollout_tokens_per_s_last_third")],
                  "o", color=AMD_COLOUR, label="first / last third")  # no middle third published: not joined
        side.axhline(amd_value("rollout_tokens_per_s_mean"), color=AMD_COLOUR, ls="--", lw=1, label="mean 311")
        gpus = int(amd_value("rollout_gpus"))
        per_gpu = summary.per_gpu_throughput(amd_value("rollout_tokens_per_s_mean"), gpus)
        side.set(xticks=[0, 1], xticklabels=["1st ⅓", "last ⅓"], xlim=(-0.5, 1.5), ylim=(low - 15, high + 15),
                 title=f"AMD (published)\n{gpus}-GPU node aggregate\n= {per_gpu:.1f} tok/s per GPU")
        side.set_ylabel("AMD tokens/s")
        side.legend(loc="lower center")
    return fig


def plot_train_rollout_mismatch(sources: Sources) -> Figure:
    """Train-rollout KL (k1 solid, k3 dashed; LumenRL's ``mismatch/k3_kl`` dotted where a source has it -- LumenRL's
    FSDP loss logs it, its DeepSeek-V4 Megatron path does not) and importance-sampling ESS per step for each source,
    with AMD's step-75 values (0.4706, k1 as LumenRL logs ``rollout_corr/kl``; 79.1%)."""
    sources = _as_list(sources)
    with styled():
        fig, (ax_kl, ax_ess) = new_figure(nrows=2, sharex=True)
        fig.set_size_inches(8.0, 6.0)
        for i, frames in _having(sources, fig, "train-rollout mismatch", _lacks(KL)):
            colour = _colours(sources)[i][0]
            kl = frames.require(KL)
            ax_kl.plot(kl.index, kl.to_numpy(), color=colour, label=f"{frames.label}: k1 {KL} (can be < 0)")
            lumenrl_k3 = f"LumenRL k3 {LUMENRL_K3} (its FSDP loss only), on π_rollout/π_trainer (≥ 0)"
            for column, style, text in ((K3_KL, "--", f"k3 {K3_KL} (≥ 0)"), (LUMENRL_K3, ":", lumenrl_k3)):
                if column in frames.train.columns and frames.train[column].notna().any():
                    k3 = frames.require(column)
                    ax_kl.plot(k3.index, k3.to_numpy(), style, color=colour, label=f"{frames.label}: {text}")
            if ESS in frames.train.columns and frames.train[ESS].notna().any():
                ess = frames.require(ESS)
                ax_ess.plot(ess.index, ess.to_numpy(), color=colour, label=f"{frames.label}: rollout IS ESS")
        ax_kl.plot([75], [amd_value("kl_train_rollout_step75")], "D", color=AMD_COLOUR,
                   label="AMD, step 75: k1 0.4706")
        ax_kl.axhline(0.0, color="#888888", lw=0.8)  # k1 below this line is noise outweighing the gap
        ax_kl.set(ylabel="KL(rollout ‖ trainer)", title="Training–rollout mismatch")
        ax_ess.plot([75], [amd_value("ess_step75")], "D", color=AMD_COLOUR, label="AMD, step 75: 79.1%")
        ax_ess.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
        ax_ess.set(xlabel="optimizer step", ylabel="effective sample size")
        for ax in (ax_kl, ax_ess):
            _legend(ax, sources, "best")
    return fig


def plot_mismatch_by_position(sources: Sources) -> Figure:
    """Train-rollout mismatch by response position in LumenRL's buckets (0–127, 128–511, ... 2048–4095 tokens),
    token-weighted over each source's whole run: k1 and k3 (top), mean |log π_rollout − log π_trainer| (bottom).
    AMD published no per-position number, so nothing of AMD's is drawn; a source without the keys is named."""
    sources = _as_list(sources)

    def lacks_buckets(frames: RunFrames) -> str | None:
        try:
            summary.mismatch_by_position(frames)
        except MetricsError:
            return "rollout_corr/pos_* keys"
        return None

    with styled():
        fig, (ax_kl, ax_abs) = new_figure(nrows=2, sharex=True)
        fig.set_size_inches(8.0, 6.0)
        buckets = [f"{start}–{end - 1}" for start, end in position_buckets()]
        widest, without_abs = 0, []
        for i, frames in _having(sources, fig, "mismatch by response position", lacks_buckets):
            colour = _colours(sources)[i][0]
            table = summary.mismatch_by_position(frames)
            x = [buckets.index(bucket) for bucket in table.index]
            widest = max(widest, max(x) + 1)
            ax_kl.plot(x, table["kl"].to_numpy(), "o-", color=colour, label=f"{frames.label}: k1 (can be < 0)")
            ax_kl.plot(x, table["k3_kl"].to_numpy(), "s--", color=colour, label=f"{frames.label}: k3 (≥ 0)")
            if "abs_diff" in table.columns and table["abs_diff"].notna().any():
                ax_abs.plot(x, table["abs_diff"].to_numpy(), "o-", color=colour,
                            label=f"{frames.label}: mean |Δ log p|")
            else:
                without_abs.append(frames.label)
        ax_kl.axhline(0.0, color="#888888", lw=0.8)
        ax_kl.set(ylabel="KL(rollout ‖ trainer)", title="Training–rollout mismatch by response position")
        ax_abs.set_xticks(range(widest), buckets[:widest])
        ax_abs.set(xlabel="token position in the response (LumenRL's buckets)",
                   ylabel="|log π_rollout − log π_trainer|")
        if without_abs:  # say so where a log has no |Δ log p| by position, rather than an empty panel
            ax_abs.text(0.5, 0.5, f"mean |Δ log p| by position not logged: {', '.join(without_abs)}",
                        transform=ax_abs.transAxes, ha="center", va="center", fontsize="small", color="#666666")
        for ax in (ax_kl, ax_abs):
            if ax.get_lines() and any(not line.get_label().startswith("_") for line in ax.get_lines()):
                _legend(ax, sources, "best")
    return fig


FIGURES = dict(zip(FIGURE_NAMES, (plot_reward_accuracy, plot_heldout_accuracy, plot_rollout_throughput,
                                  plot_train_rollout_mismatch)))


def figure_bytes(fig: Figure, ext: str) -> bytes:
    """The figure as a PNG or SVG file's bytes, without dates or software versions: the same frames give the same
    bytes, whether saved (``save_figure``) or embedded in the report page."""
    buffer = io.BytesIO()
    with styled():
        fig.savefig(buffer, format=ext, metadata={"png": PNG_METADATA, "svg": SVG_METADATA}[ext])
    return buffer.getvalue()


def save_figure(fig: Figure, out_dir: str | Path, name: str) -> list[Path]:
    """Write NAME.png and NAME.svg; each goes to a temp file first and is renamed, so a reader never sees half."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for ext in ("png", "svg"):
        final = out_dir / f"{name}.{ext}"
        tmp = out_dir / f".{name}.{ext}.tmp"
        try:
            tmp.write_bytes(figure_bytes(fig, ext))
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        written.append(final)
    return written


def make_all_figures(sources, out_dir: str | Path, **source_options) -> list[Path]:
    """Every figure the sources have data for, as PNG + SVG; ``sources``: run sources (repro.analysis.sources) or
    frames, one or a list. A figure no source can draw is skipped with a warning naming what is missing (e.g. a run
    stopped before its first evaluation)."""
    frames = load_sources(sources, **source_options)
    written = []
    for name, plot in FIGURES.items():
        try:
            fig = plot(frames)
        except MetricsError as err:
            warnings.warn(f"figure {name} skipped: {err}", stacklevel=2)
            continue
        written += save_figure(fig, out_dir, name)
    return written


def plot_mismatch_by_source_and_position(k1, k3) -> Figure:
    """k1 (top) and k3 (bottom) KL between rollout and trainer by response position, one line per numeric source:
    ``k1``, ``k3``: frames indexed by bucket start, one column per source (``repro.studies.mismatch_sources``)."""
    with styled():
        fig, (ax_k1, ax_k3) = new_figure(nrows=2, sharex=True)
        fig.set_size_inches(8.0, 6.0)
        for column in k1.columns:
            ax_k1.plot(k1.index, k1[column].to_numpy(), marker="o", label=column)
            ax_k3.plot(k3.index, k3[column].to_numpy(), marker="o", label=column)
        ax_k1.axhline(0.0, color="grey", linewidth=0.8)
        ax_k1.set_ylabel("k1 KL  E[log π_rollout − log π_old]")
        ax_k3.set_ylabel("k3 KL")
        ax_k3.set_xlabel("response position (bucket start, tokens)")
        ax_k1.legend(fontsize="small")
        fig.suptitle("train-rollout mismatch by response position, cumulative numeric sources")
    return fig
