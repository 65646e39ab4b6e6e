"""Figures: files written atomically as PNG + SVG, every plotted series is the frame's data unchanged, several
sources overlay in their own colours, and a source that lacks a figure's column is named under it."""

import argparse
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from repro.analysis import MetricsError, load_run, load_source
from repro.analysis import summary
from repro.analysis.synthetic import write_synthetic_run
from repro.analysis.plots import (AMD_COLOUR, FIGURE_NAMES, make_all_figures, plot_heldout_accuracy,
                                  plot_reward_accuracy, plot_rollout_throughput, plot_train_rollout_mismatch,
                                  save_figure)

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    # a fixed folder name: the label is the folder's name, and mktemp numbers "run" folders across the session
    return write_synthetic_run(tmp_path_factory.mktemp("plots") / "run0", steps=75, seed=0)


@pytest.fixture(scope="module")
def frames(run_dir):
    return load_run(run_dir)


def _amd_lines(ax):
    return [line for line in ax.lines if line.get_color() == AMD_COLOUR]


def test_all_figures_written_as_png_and_svg(run_dir, tmp_path):
    paths = make_all_figures(run_dir, tmp_path / "figs")
    assert sorted(p.name for p in paths) == sorted(f"{n}.{e}" for n in FIGURE_NAMES for e in ("png", "svg"))
    for path in paths:
        data = path.read_bytes()
        assert len(data) > 1000
        assert data.startswith(b"\x89PNG") if path.suffix == ".png" else b"<svg" in data[:1000]
    assert not list((tmp_path / "figs").glob(".*.tmp"))  # temp files renamed, none left behind


def test_reward_accuracy_plots_the_frame(frames):
    ax = plot_reward_accuracy(frames).axes[0]
    acc = frames.train["reward/accuracy"]
    np.testing.assert_array_equal(ax.lines[0].get_xdata(), acc.index.to_numpy())
    np.testing.assert_array_equal(ax.lines[0].get_ydata(), acc.to_numpy())
    phase_y = ax.lines[1].get_ydata()
    np.testing.assert_allclose(phase_y[~np.isnan(phase_y)][::2], summary.phase_means(acc)["mean"].to_numpy())
    amd = _amd_lines(ax)
    np.testing.assert_allclose(amd[0].get_ydata()[::3], [0.45, 0.53, 0.59])
    assert sorted(line.get_ydata()[0] for line in amd[1:]) == [0.266, 0.777]


def test_heldout_accuracy_plots_evals_with_intervals(frames):
    ax = plot_heldout_accuracy(frames).axes[0]
    np.testing.assert_array_equal(ax.lines[0].get_xdata(), [0, 25, 50, 75])
    np.testing.assert_allclose(ax.lines[0].get_ydata(), frames.eval["eval/avg@8"].to_numpy())
    table = summary.eval_table(frames)
    (_, caps, _), = [c for c in ax.containers]  # the error bars: caps sit at the interval bounds
    np.testing.assert_allclose(sorted(caps[0].get_ydata()), sorted(table["low"]))
    np.testing.assert_allclose(sorted(caps[1].get_ydata()), sorted(table["high"]))
    (amd,) = _amd_lines(ax)
    np.testing.assert_allclose(amd.get_ydata(), [0.300, 0.492])
    # AMD's start is the evaluation after the first update (LumenRL has none before it); the two points are not
    # joined, since nothing was published in between
    assert amd.get_xdata().tolist() == [1, 75] and amd.get_linestyle() == "None"


def test_throughput_run_axis_and_separate_amd_axis(frames):
    run_ax, amd_ax = plot_rollout_throughput(frames).axes
    tps = frames.train["perf/rollout_tokens_per_s"]
    np.testing.assert_array_equal(run_ax.lines[0].get_ydata(), tps.to_numpy())
    thirds_y = run_ax.lines[1].get_ydata()
    expected = [tps.loc[1:25].mean(), tps.loc[26:50].mean(), tps.loc[51:75].mean()]
    np.testing.assert_allclose(thirds_y[~np.isnan(thirds_y)][::2], expected)
    assert not _amd_lines(run_ax)  # AMD's numbers live on their own axis, not on the run's scale
    np.testing.assert_allclose(amd_ax.lines[0].get_ydata(), [315.2, 308.6])
    assert amd_ax.lines[0].get_linestyle() == "None"  # two published thirds, no middle one: not joined


def test_mismatch_plots_k1_and_k3_labelled_with_amd_step75(frames):
    ax_kl, ax_ess = plot_train_rollout_mismatch(frames).axes
    k1, k3, amd_kl, zero = ax_kl.lines
    np.testing.assert_array_equal(k1.get_ydata(), frames.train["rollout_corr/kl"].to_numpy())
    np.testing.assert_array_equal(k3.get_ydata(), frames.train["rollout_corr/k3_kl"].to_numpy())
    assert (k1.get_label(), k1.get_linestyle()) == ("run0: k1 rollout_corr/kl (can be < 0)", "-")
    assert (k3.get_label(), k3.get_linestyle()) == ("run0: k3 rollout_corr/k3_kl (≥ 0)", "--")
    assert (amd_kl.get_xdata()[0], amd_kl.get_ydata()[0]) == (75, 0.4706)
    assert "k1 0.4706" in amd_kl.get_label() and zero.get_ydata()[0] == 0.0
    np.testing.assert_array_equal(ax_ess.lines[0].get_ydata(),
                                  frames.train["rollout_corr/rollout_is_eff_sample_size"].to_numpy())
    assert (ax_ess.lines[1].get_xdata()[0], ax_ess.lines[1].get_ydata()[0]) == (75, 0.791)


def test_several_sources_overlay_in_their_own_colours(frames):
    log = load_source(DATA / "lumenrl" / "train.log")
    ax = plot_reward_accuracy([frames, log]).axes[0]
    ours, ours_mean, theirs, theirs_mean = ax.lines[:4]
    np.testing.assert_array_equal(ours.get_ydata(), frames.train["reward/accuracy"].to_numpy())
    np.testing.assert_array_equal(theirs.get_xdata(), np.arange(1, 13))
    np.testing.assert_array_equal(theirs.get_ydata(), log.train["reward/accuracy"].to_numpy())
    assert [line.get_label() for line in (ours, theirs_mean)] == ["run0, per step", "train, 25-step mean"]
    assert ours.get_color() == ours_mean.get_color() != theirs.get_color() != AMD_COLOUR
    ax_kl = plot_train_rollout_mismatch([frames, log]).axes[0]
    lumen_k3 = [line for line in ax_kl.lines if "mismatch/k3_kl" in line.get_label()]
    assert [line.get_label() for line in lumen_k3] == \
        ["train: LumenRL k3 mismatch/k3_kl (its FSDP loss only), on π_rollout/π_trainer (≥ 0)"]
    np.testing.assert_array_equal(lumen_k3[0].get_ydata(), log.train["mismatch/k3_kl"].to_numpy())


def test_a_source_without_the_column_is_named_under_the_figure(frames):
    panels = load_source("wandb:" + str(DATA / "wandb" / "panel_*.csv"))
    fig = plot_rollout_throughput([frames, panels])
    assert [t.get_text() for t in fig.texts] == ["not shown: wandb (no perf/rollout_tokens_per_s)"]
    assert len(fig.axes[0].lines) == 2  # the run's per-step series and its thirds only
    with pytest.raises(MetricsError, match=r"held-out accuracy: no source has the data: wandb \(no eval/avg@k\)"):
        plot_heldout_accuracy(panels)


def test_save_is_reproducible(frames, tmp_path):
    fig = plot_reward_accuracy(frames)
    first = [p.read_bytes() for p in save_figure(fig, tmp_path / "a", "acc")]
    second = [p.read_bytes() for p in save_figure(fig, tmp_path / "b", "acc")]
    assert first[1] == second[1]  # SVG: no date, fixed id salt


def test_run_without_evals_skips_that_figure(tmp_path):
    run_dir = write_synthetic_run(tmp_path / "run", steps=10, seed=0)
    log = run_dir / "metrics.jsonl"
    log.write_text("".join(line + "\n" for line in log.read_text().splitlines() if '"kind": "eval"' not in line))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        paths = make_all_figures(run_dir, tmp_path / "figs")
    assert len(paths) == 6 and "heldout_accuracy" in str(caught[0].message)


def test_figures_command(run_dir, tmp_path):
    from repro.commands import figures

    parser = argparse.ArgumentParser()
    figures.add_arguments(parser)
    assert parser.parse_args([str(run_dir)]).out.name == "figures"
    assert figures.run(parser.parse_args([str(run_dir), "--out", str(tmp_path / "out")])) == 0
    assert len(list((tmp_path / "out").glob("*.svg"))) == 4
    # several sources at once, of several kinds: every figure some source can draw
    sources = [str(run_dir), str(DATA / "lumenrl" / "train.log"), "wandb:" + str(DATA / "wandb" / "panel_*.csv")]
    assert figures.run(parser.parse_args(sources + ["--out", str(tmp_path / "three")])) == 0
    assert len(list((tmp_path / "three").glob("*.svg"))) == 4


def test_the_mismatch_by_position_says_where_a_log_has_no_abs_diff_instead_of_an_empty_panel():
    """A source with rollout_corr/pos_* k1/k3 but no |Δ log p| per bucket: the lower panel holds no curve and no
    legend, and says which source did not log it."""
    from repro.analysis.frame import RunFrames
    from repro.analysis.plots import plot_mismatch_by_position
    from repro.metric_keys import position_buckets, position_key

    rows = {}
    for step in (1, 2):
        row = {}
        for start, end in position_buckets()[:2]:
            row[position_key(start, end, "kl")] = 0.01 * step
            row[position_key(start, end, "k3_kl")] = 0.02 * step
            row[position_key(start, end, "tokens")] = 100.0
        rows[step] = row
    train = pd.DataFrame.from_dict(rows, orient="index")
    train.index.name = "step"
    frames = RunFrames(train=train, eval=pd.DataFrame(index=pd.Index([], name="step")), recipe=None,
                       label="no-abs", kind="lumenrl", source=Path("x.log"))
    fig = plot_mismatch_by_position([frames])
    ax_kl, ax_abs = fig.axes[:2]
    assert len([line for line in ax_kl.get_lines() if not line.get_label().startswith("_")]) == 2
    assert not ax_abs.get_lines() and ax_abs.get_legend() is None
    assert [t.get_text() for t in ax_abs.texts] == ["mean |Δ log p| by position not logged: no-abs"]
