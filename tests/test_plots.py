"""Figures: files written atomically as PNG + SVG, and every plotted series is the frame's data unchanged."""

import argparse
import warnings

import numpy as np
import pytest

from repro.analysis import load_run
from repro.analysis import summary
from repro.analysis.synthetic import write_synthetic_run
from repro.plots import (AMD_COLOUR, FIGURE_NAMES, make_all_figures, plot_heldout_accuracy, plot_reward_accuracy,
                         plot_rollout_throughput, plot_train_rollout_mismatch, save_figure)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return write_synthetic_run(tmp_path_factory.mktemp("run"), steps=75, seed=0)


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
    np.testing.assert_allclose(_amd_lines(ax)[0].get_ydata(), [0.300, 0.492])


def test_throughput_run_axis_and_separate_amd_axis(frames):
    run_ax, amd_ax = plot_rollout_throughput(frames).axes
    tps = frames.train["perf/rollout_tokens_per_s"]
    np.testing.assert_array_equal(run_ax.lines[0].get_ydata(), tps.to_numpy())
    thirds_y = run_ax.lines[1].get_ydata()
    expected = [tps.loc[1:25].mean(), tps.loc[26:50].mean(), tps.loc[51:75].mean()]
    np.testing.assert_allclose(thirds_y[~np.isnan(thirds_y)][::2], expected)
    assert not _amd_lines(run_ax)  # AMD's numbers live on their own axis, not on the run's scale
    np.testing.assert_allclose(amd_ax.lines[0].get_ydata(), [315.2, 308.6])


def test_mismatch_plots_kl_and_ess_with_amd_step75(frames):
    ax_kl, ax_ess = plot_train_rollout_mismatch(frames).axes
    np.testing.assert_array_equal(ax_kl.lines[0].get_ydata(), frames.train["rollout_corr/kl"].to_numpy())
    np.testing.assert_array_equal(ax_ess.lines[0].get_ydata(),
                                  frames.train["rollout_corr/rollout_is_eff_sample_size"].to_numpy())
    assert (ax_kl.lines[1].get_xdata()[0], ax_kl.lines[1].get_ydata()[0]) == (75, 0.4706)
    assert (ax_ess.lines[1].get_xdata()[0], ax_ess.lines[1].get_ydata()[0]) == (75, 0.791)


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
