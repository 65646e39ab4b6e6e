"""Summary numbers on hand-built series, the AMD comparison table on a seeded synthetic run, loader errors."""

import argparse
import json
import math

import numpy as np
import pandas as pd
import pytest

from repro.analysis import MetricsError, compare_to_amd, load_run, write_report
from repro.analysis import summary
from repro.analysis.frame import TornLineWarning
from repro.analysis.synthetic import write_synthetic_run


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    return load_run(write_synthetic_run(tmp_path_factory.mktemp("cpu"), steps=75, seed=0))


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory):
    return load_run(write_synthetic_run(tmp_path_factory.mktemp("gpu"), steps=75, seed=1,
                                        recipe="amd-dsv4-flash-mi308x"))


def _series(values, start=1, name="x"):
    return pd.Series(values, index=pd.RangeIndex(start, start + len(values), name="step"), name=name, dtype=float)


def test_phase_means_by_step_number():
    table = summary.phase_means(_series(np.arange(1, 76) / 100), 25)
    assert table.index.tolist() == [1, 2, 3]
    assert table["first_step"].tolist() == [1, 26, 51] and table["last_step"].tolist() == [25, 50, 75]
    assert table["mean"].tolist() == pytest.approx([0.13, 0.38, 0.63])
    small = summary.phase_means(_series([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.9]), 3)
    assert small["mean"].tolist() == pytest.approx([0.2, 0.5, 0.9])
    assert small["steps"].tolist() == [3, 3, 1]  # a partial last phase is reported with its count
    assert small["sem"].iloc[0] == pytest.approx(0.1 / math.sqrt(3))


def test_extremes_thirds_and_throughput():
    assert summary.step_extremes(_series([0.5, 0.266, 0.777, 0.6])) == {
        "min": 0.266, "min_step": 2, "max": 0.777, "max_step": 3}
    stats = summary.throughput_summary(_series(np.arange(1, 76, dtype=float)))
    assert (stats["first_third"], stats["middle_third"], stats["last_third"]) == (13.0, 38.0, 63.0)
    assert (stats["mean"], stats["min"], stats["max"]) == (38.0, 1.0, 75.0)
    assert [len(p) for p in summary.thirds(_series(range(10)))] == [4, 3, 3]


def test_bootstrap_interval_exact_and_contains_mean():
    # resamples=4, seed 0 draws problem indices [[1,1],[1,0],[0,0],[0,0]] -> means 0, .5, 1, 1.
    assert summary.bootstrap_avg_ci([8, 0], 8, resamples=4, seed=0) == pytest.approx((0.5, 0.0375, 1.0))
    counts = [0, 1, 2, 3, 4, 5, 6, 7, 8] * 3 + [8, 8, 0]
    avg, low, high = summary.bootstrap_avg_ci(counts, 8, resamples=10_000, seed=0)
    assert (avg, low, high) == pytest.approx((31 / 60, 0.39166666666666666, 0.6375))
    assert low < avg < high
    assert summary.bootstrap_avg_ci([4] * 30, 8) == (0.5, 0.5, 0.5)  # no spread over problems, no interval
    with pytest.raises(MetricsError):
        summary.bootstrap_avg_ci([], 8)


def test_time_to_train_gpu_and_cpu(gpu_run, cpu_run):
    t = summary.time_to_train(gpu_run, steps=75)
    step_s = gpu_run.train["timing_s/step"].mean()
    assert t["unit"] == "GPU-hours" and t["devices"] == 24
    assert t["device_hours_per_step"] == pytest.approx(step_s * 24 / 3600)
    assert t["device_hours_for_steps"] == pytest.approx(step_s * 75 * 24 / 3600)
    c = summary.time_to_train(cpu_run, steps=75, cores=2)
    assert c["unit"] == "core-hours" and c["device_hours_for_steps"] == pytest.approx(
        cpu_run.train["timing_s/step"].mean() * 75 * 2 / 3600)
    assert summary.per_gpu_throughput(311.0, 8) == 38.875
    with pytest.raises(MetricsError):
        summary.per_gpu_throughput(311.0, 0)


def test_eval_table_matches_counts(cpu_run):
    table = summary.eval_table(cpu_run)
    assert table.index.tolist() == [0, 25, 50, 75]
    for step, row in table.iterrows():
        counts = cpu_run.eval.loc[step, "eval/correct_counts"]
        assert row["avg"] == pytest.approx(sum(counts) / 240) and row["problems"] == 30
        assert row["low"] <= row["avg"] <= row["high"]


def test_comparison_rows_and_values(cpu_run):
    table = compare_to_amd(cpu_run).set_index("metric")
    acc = cpu_run.train["reward/accuracy"]
    assert table.loc["reward accuracy, steps 1-25", "amd"] == 0.45
    assert table.loc["reward accuracy, steps 26-50", "run"] == pytest.approx(acc.loc[26:50].mean())
    third = table.loc["reward accuracy, steps 51-75"]
    assert third["difference"] == pytest.approx(acc.loc[51:75].mean() - 0.59)
    half = 1.96 * acc.loc[51:75].std() / 5
    assert (third["band_low"], third["band_high"]) == pytest.approx((third["run"] - half, third["run"] + half))
    assert third["inside"] == (third["band_low"] <= 0.59 <= third["band_high"])
    assert table.loc["reward accuracy, lowest single step", "run"] == acc.min()
    end = table.loc["held-out avg@k, end"]
    assert (end["step"], end["key"], end["note"]) == (75, "eval/avg@8", "30 problems")
    avg, low, high = summary.bootstrap_avg_ci(cpu_run.eval.loc[75, "eval/correct_counts"], 8)
    assert (end["amd"], end["run"], end["band_low"], end["band_high"]) == pytest.approx((0.492, avg, low, high))
    thr = table.loc["rollout tokens/s, first third"]
    assert thr["run"] == pytest.approx(cpu_run.train["perf/rollout_tokens_per_s"].loc[1:25].mean())
    assert thr["inside"] is None  # a CPU run's tokens/s are not compared with an MI308X node's
    kl = table.loc["train-rollout KL, k1 estimator, end"]
    assert (kl["amd"], kl["run"], kl["band"], kl["inside"]) == \
        (0.4706, cpu_run.train.loc[75, "rollout_corr/kl"], "no band", None)
    k3 = table.loc["train-rollout KL, k3 estimator, end"]
    assert math.isnan(k3["amd"]) and k3["run"] == cpu_run.train.loc[75, "rollout_corr/k3_kl"] and k3["step"] == 75
    assert table.loc["effective sample size, end", "amd"] == 0.791
    assert table["quantity"].tolist() == ["fraction"] * 7 + ["tokens_per_s"] * 4 + ["kl", "kl", "fraction"]
    assert len(table) == 14


def test_gpu_run_compares_throughput_and_per_gpu(gpu_run):
    table = compare_to_amd(gpu_run).set_index("metric")
    mean = gpu_run.train["perf/rollout_tokens_per_s"].mean()
    assert table.loc["rollout tokens/s, mean", "inside"] == (287 <= mean <= 331)
    per_gpu = table.loc["rollout tokens/s per GPU, mean"]
    assert (per_gpu["amd"], per_gpu["run"]) == pytest.approx((38.875, mean / 8))


def test_report_and_command(tmp_path, cpu_run, gpu_run):
    text = write_report(cpu_run, tmp_path / "r.md").read_text()
    assert "mechanism check, not a replication" in text and "| metric | AMD |" in text and "core-hours" in text
    assert "GPU-hours" in write_report(gpu_run, tmp_path / "g.md").read_text()
    from repro.commands import compare

    run_dir = write_synthetic_run(tmp_path / "run", steps=30, seed=3)
    parser = argparse.ArgumentParser()
    compare.add_arguments(parser)
    assert compare.run(parser.parse_args([str(run_dir)])) == 0
    assert (run_dir / "comparison.md").read_text().startswith("# tiny-cpu")


def test_load_run_errors_name_the_file(tmp_path):
    with pytest.raises(MetricsError, match="run directory not found"):
        load_run(tmp_path / "nope")
    run_dir = write_synthetic_run(tmp_path / "run", steps=5, seed=0)
    log = run_dir / "metrics.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines) + '\n{"kind": "train", "st')  # torn last line: dropped, as the run does
    with pytest.warns(TornLineWarning, match=rf"metrics\.jsonl:{len(lines) + 1}: torn last line dropped"):
        assert load_run(run_dir).train.index.tolist() == [1, 2, 3, 4, 5]
    log.write_text("\n".join(lines[:2] + ["{not json"] + lines[2:]) + "\n")
    with pytest.raises(MetricsError, match=r"metrics.jsonl:3: corrupt line"):
        load_run(run_dir)
    log.write_text("")
    with pytest.raises(MetricsError, match="metrics.jsonl: metrics log is empty"):
        load_run(run_dir)
    log.write_text(json.dumps({"kind": "eval", "step": 0, "eval/avg@8": 0.3}) + "\n")
    with pytest.raises(MetricsError, match="no training rows"):
        load_run(run_dir)
    log.unlink()
    with pytest.raises(MetricsError, match="metrics.jsonl: metrics log not found"):
        load_run(run_dir)
    (run_dir / "recipe.yaml").unlink()
    with pytest.raises(MetricsError, match="recipe.yaml: recipe not found"):
        load_run(run_dir)


def test_repeated_step_keeps_last_row(tmp_path):
    run_dir = write_synthetic_run(tmp_path / "run", steps=3, seed=0)
    with open(run_dir / "metrics.jsonl", "a") as handle:
        handle.write(json.dumps({"kind": "train", "step": 2, "reward/accuracy": 0.99}) + "\n")
    assert load_run(run_dir).train.loc[2, "reward/accuracy"] == 0.99


def test_the_mismatch_at_the_end_of_a_run_is_read_at_step_75_or_the_last_logged_one(tmp_path):
    """Notebook 13's table and recorded results (repro.analysis.summary), on a run whose KL/ESS rows are known."""
    from repro.analysis.frame import ESS, K3_KL, KL

    run = load_run(write_synthetic_run(tmp_path / "run", steps=75, seed=2))
    short = load_run(write_synthetic_run(tmp_path / "short", steps=30, seed=2))
    at = summary.mismatch_at_step(run)
    assert at["kl"] == (75, float(run.train.loc[75, KL])) and at["ess"] == (75, float(run.train.loc[75, ESS]))
    assert summary.mismatch_at_step(short)["k3"] == (30, float(short.train.loc[30, K3_KL]))  # the last logged step
    no_k3 = run.train.drop(columns=[K3_KL])
    run_without_k3 = type(run)(**{**vars(run), "train": no_k3})
    assert summary.mismatch_at_step(run_without_k3)["k3"] == (None, None)

    results = summary.mismatch_at_end_results([run, short])
    assert list(results) == ["kl_step", "kl", "k3_step", "k3", "ess_step", "ess", "kl_mean", "ess_mean"]
    assert results["kl_step"] == {run.label: 75, short.label: 30}
    assert results["ess_mean"][run.label] == pytest.approx(float(run.train[ESS].mean()))

    table = summary.mismatch_at_end_table([run], {"kl": 0.4706, "ess": 0.791})
    assert table.loc["KL, k1 estimator (can be < 0)", "AMD"] == 0.4706 and \
        table.loc["effective sample size: at step", "AMD"] == 75
    assert math.isnan(table.loc["KL, k3 estimator (≥ 0)", "AMD"])  # AMD published no k3
    assert summary.mismatch_quantities(table)["effective sample size"] == "fraction"
