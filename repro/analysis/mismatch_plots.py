"""Figures of issue 31: the mismatch by response position in runs and on a fixed batch, and its attribution.

Kept apart from ``repro.analysis.plots`` (the figures of one run's metrics) because these read the rows of
``repro.studies.mismatch_attribution`` rather than run frames; they share its style and its ``save_figure``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from repro.analysis.plots import new_figure, styled


def _weighted(rows: list[dict], stat: str) -> pd.DataFrame:
    """``stat`` by bucket start (rows) and configuration (columns), token-weighted over seeds."""
    frame = pd.DataFrame(rows)
    frame["weighted"] = frame[stat] * frame["tokens"]
    grouped = frame.groupby(["start", "config"], sort=False)[["weighted", "tokens"]].sum()
    return (grouped["weighted"] / grouped["tokens"]).unstack("config")


def plot_kl_by_position(run_tables: dict[str, pd.DataFrame], fixed_rows: list[dict],
                        configs: tuple[str, ...] = ("all on (the run)", "weights only")) -> Figure:
    """Left: k3 per LumenRL bucket of each run (``run_tables``: label -> ``summary.mismatch_by_position``);
    right: k3 per fine bucket on the fixed batch for ``configs`` (rows of ``mismatch_attribution.attribute``)."""
    with styled():
        fig, (ax_runs, ax_fine) = new_figure(ncols=2)
        fig.set_size_inches(11.0, 4.2)
        labels = list(run_tables)
        buckets = sorted({b for t in run_tables.values() for b in t.index}, key=lambda b: int(b.split("–")[0]))
        width = 0.8 / max(len(labels), 1)
        for i, label in enumerate(labels):
            table = run_tables[label]
            values = [table.loc[b, "k3_kl"] if b in table.index else np.nan for b in buckets]
            ax_runs.bar(np.arange(len(buckets)) + i * width, values, width, label=label)
        ax_runs.set_xticks(np.arange(len(buckets)) + width * (len(labels) - 1) / 2, buckets)
        ax_runs.set_xlabel("response position (LumenRL's buckets)")
        ax_runs.set_ylabel("k3 KL, 75-step run mean (raw log-probs, as logged)")
        ax_runs.legend(fontsize="small")
        k3 = _weighted(fixed_rows, "k3")
        for config in configs:
            if config in k3.columns:
                ax_fine.plot(k3.index, k3[config].to_numpy(), marker="o", label=config)
        ax_fine.set_xlabel("response position (bucket start, tokens)")
        ax_fine.set_ylabel("k3 KL, fixed batch (processed unless the row says raw)")
        ax_fine.legend(fontsize="small")
        fig.suptitle("train-rollout mismatch by response position (tiny-cpu-long; emulated FP8 numerics)")
    return fig


def plot_attribution(position_rows: list[dict]) -> Figure:
    """Top: k3 per fine bucket for every attribution row; bottom: the share of (token, layer) pairs where the
    trainer's own indexer keeps other entries / its router picks other experts than the rollout's (all on)."""
    with styled():
        fig, (ax_k3, ax_share) = new_figure(nrows=2, sharex=True)
        fig.set_size_inches(9.0, 7.0)
        k3 = _weighted(position_rows, "k3")
        for i, config in enumerate(k3.columns):  # past the 10 colours of the cycle, dashed lines tell rows apart
            ax_k3.plot(k3.index, k3[config].to_numpy(), marker="o", label=config, linestyle="--" if i >= 10 else "-")
        ax_k3.set_ylabel("k3 KL")
        ax_k3.set_yscale("log")
        ax_k3.legend(fontsize="x-small", ncol=2)
        first = next(iter(k3.columns))
        for stat, label in (("indexer_disagree", "indexer keeps other entries"),
                            ("routing_flip", "router picks other experts")):
            share = _weighted(position_rows, stat)[first]
            ax_share.plot(share.index, share.to_numpy(), marker="o", label=f"{label} ({first})")
        ax_share.set_ylabel("share of (token, layer)")
        ax_share.set_xlabel("response position (bucket start, tokens)")
        ax_share.legend(fontsize="small")
        fig.suptitle("which source carries the mismatch, by position (one source off or replayed)")
    return fig
