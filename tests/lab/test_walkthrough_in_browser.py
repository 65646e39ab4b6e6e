"""The walkthrough as a person meets it: notebooks 00, 10-13 and 20 run in JupyterLab in a real Chromium.

How the run source is set: the test types it into each notebook's parameters cell, as the notebooks tell a person
to do, and types it *relative to the kernel's folder* (``../runs/lab-test/run`` from ``notebooks/``), as a person
in JupyterLab would. Pointing the default ``runs/tiny-cpu`` at the test's run instead would need writing into (or
replacing) a person's own run; typing the path tests the real edit and the rule that a typed path is taken from
where the kernel is. The defaults' resolution against the project root is seen here on notebook 00, whose default
writes only its own results file (put back afterwards), and in tests/test_notebook_setup.py. Each notebook's page
must show no error, its tables and figures, and the results file it records must hold the numbers repro.analysis
computes from the same run.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

from lab_browser import LabFailure, edited_parameters, run_in_browser
from lab_server import make_lab_commands
from repro import REPO_DIR
from repro.notebooks import ANALYSIS, NOTEBOOKS_DIR, load_results

NOTEBOOKS = ("00_cluster_check", *ANALYSIS)  # the analysis notebooks as repro.notebooks.catalog lists them
# the cells whose outputs must hold an HTML table, and those that must show a rendered figure (<img>/<svg>)
SHOWN = {"00_cluster_check": ({2}, set()), "10_reward_by_phase": ({3}, {6}), "11_aime": ({3}, {6}),
         "12_throughput": ({3, 4, 5}, {7}), "13_kl_ess": ({3, 4, 8}, {6, 8}), "20_compare_to_amd": ({4, 6}, set())}


def typed(path: Path) -> str:
    """A path as a person in JupyterLab types it: relative to notebooks/, where the kernel starts."""
    return os.path.relpath(path, NOTEBOOKS_DIR)


def parameters_for(name: str, run: Path) -> dict[str, str]:
    return {"out_dir": typed(run / "notebooks")} if name == "00_cluster_check" else {"source": typed(run)}


def test_the_lane_starts_lab_with_make_labs_commands():
    install, lab = make_lab_commands()
    assert install == [sys.executable, "-m", "ipykernel", "install", "--sys-prefix", "--name", "repro",
                       "--display-name", "repro (.venv)"]
    as_root = ["--allow-root"] if os.geteuid() == 0 else []  # jupyter_server's refusal to run as root otherwise
    assert lab == [str(Path(sys.executable).parent / "jupyter"), "lab", "--ip", "127.0.0.1", *as_root, "notebooks/"]


def test_edited_parameters_replace_values_and_keep_comments():
    cell = 'source = "runs/tiny-cpu"   # one source\nout_dir = ""  # results\nphase_len = 25'
    assert edited_parameters(cell, {"source": "../runs/x", "out_dir": "a b"}) == \
        'source = "../runs/x"   # one source\nout_dir = "a b"  # results\nphase_len = 25'
    with pytest.raises(LabFailure, match="no assignment to run_dir"):
        edited_parameters(cell, {"run_dir": "x"})


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_clean_in_the_browser_and_records_the_librarys_numbers(name, page, lab, small_run, lane_dir):
    view = run_in_browser(page, lab.login_url, name, parameters_for(name, small_run), lane_dir / "screenshots")
    tables, figures = SHOWN[name]
    assert tables <= view.cells_with_tables() and figures <= view.cells_with_figures(), (
        f"{name}: tables in cells {sorted(view.cells_with_tables())}, figures in cells "
        f"{sorted(view.cells_with_figures())}; expected tables in {sorted(tables)}, figures in {sorted(figures)} "
        f"(screenshot: {view.screenshot})")
    assert view.screenshot.stat().st_size > 10_000
    for index in figures:
        assert view.screenshot.with_name(f"{name}.cell{index}.png").stat().st_size > 10_000
    if name != "00_cluster_check":  # the typed relative path was read from notebooks/: the page names the run
        assert str(small_run) in view.text()
    record = load_results(name, small_run / "notebooks")
    # the project kernel `make lab` installs: this venv's interpreter, not some other python3 on the machine
    assert record["kernel_python"] == sys.executable
    CHECKS[name](record, small_run)


def check_cluster(record: dict, run: Path) -> None:
    from repro.readiness import checks
    from repro.readiness.facts import gather_facts
    from repro.recipes import load_recipe

    spec = load_recipe("tiny-cpu")
    expected = checks.results_as_dicts(checks.run_checks(spec, gather_facts(spec)))
    assert [(r["check"], r["status"]) for r in record["checks"]] == [(r["check"], r["status"]) for r in expected]
    assert record["cpu_mode"] is True and record["failed"] is False and record["expected_gpus"] == 0


def check_reward_by_phase(record: dict, run: Path) -> None:
    from repro.analysis import load_run, summary

    frames = load_run(run)
    accuracy, label = frames.train["reward/accuracy"], frames.label
    assert record["sources"] == [label]
    assert record["phase_means"] == {label: {"1": pytest.approx(summary.phase_means(accuracy, 25).loc[1, "mean"])}}
    assert record["phase_steps"] == {label: {"1": 3}}
    assert record["amd_phase_means"] == {"1": 0.45, "2": 0.53, "3": 0.59}
    assert record["extremes"] == {label: summary.step_extremes(accuracy)}
    assert_figures(record, run, "reward_accuracy")


def check_aime(record: dict, run: Path) -> None:
    from repro.analysis import load_run, summary

    frames = load_run(run)
    label, table = frames.label, summary.eval_table(frames)
    # at start (tiny-cpu), after the first update (LumenRL's extra evaluation), every 2 steps, and the last step
    assert record["eval_steps"] == {label: [0, 1, 2, 3]} == {label: list(table.index)}
    for step, row in table.iterrows():
        s = str(step)
        assert record["avg"][label][s] == pytest.approx(row["avg"])
        assert record["ci_low"][label][s] == pytest.approx(row["low"])
        assert record["ci_high"][label][s] == pytest.approx(row["high"])
    assert (record["amd_start"], record["amd_end"]) == (0.30, 0.492)
    assert_figures(record, run, "heldout_accuracy")


def check_throughput(record: dict, run: Path) -> None:
    from repro.analysis import load_run, summary

    frames = load_run(run)
    expected = summary.throughput_summary(frames.train["perf/rollout_tokens_per_s"])
    assert record["throughput"] == {frames.label: {k: pytest.approx(v) for k, v in expected.items()}}
    assert record["amd_throughput"]["mean"] == 311
    assert_figures(record, run, "rollout_throughput")


def check_kl_ess(record: dict, run: Path) -> None:
    from repro.analysis import load_run

    frames = load_run(run)
    label, last = frames.label, frames.train.iloc[-1]
    assert record["kl_step"] == record["k3_step"] == record["ess_step"] == {label: 3}
    assert record["kl"][label] == pytest.approx(last["rollout_corr/kl"])
    assert record["k3"][label] == pytest.approx(last["rollout_corr/k3_kl"])
    assert record["ess"][label] == pytest.approx(last["rollout_corr/rollout_is_eff_sample_size"])
    assert (record["amd_kl_step75"], record["amd_ess_step75"]) == (0.4706, 0.791)
    assert_figures(record, run, "train_rollout_mismatch")
    tokens = frames.train["perf/generated_tokens"]
    assert record["mismatch_by_position"][label]["0–127"]["tokens"] == tokens.sum()  # answers fill the first bucket
    assert record["mismatch_by_position"][label]["0–127"]["kl"] == pytest.approx(
        (frames.train["rollout_corr/kl"] * tokens).sum() / tokens.sum())
    assert sorted(Path(p).name for p in record["position_figures"]) == [
        "mismatch_by_position.png", "mismatch_by_position.svg"]


def check_compare(record: dict, run: Path) -> None:
    from repro.analysis import compare_to_amd, load_run

    frames = load_run(run)
    table = compare_to_amd(frames)
    assert record["metrics"] == table["metric"].tolist()
    for got, want in zip(record["rows"][frames.label], table.to_dict("records"), strict=True):
        for column in ("amd", "run"):  # NaN is recorded as null
            assert (got[column] is None and math.isnan(want[column])) or got[column] == pytest.approx(want[column])
    assert Path(record["report"]) == run / "comparison.md"
    assert "mechanism check, not a replication" in (run / "comparison.md").read_text()


def assert_figures(record: dict, run: Path, stem: str) -> None:
    assert sorted(Path(p) for p in record["figures"]) == [run / "figures" / f"{stem}.{ext}" for ext in ("png", "svg")]
    assert all(Path(p).stat().st_size > 5_000 for p in record["figures"])


CHECKS = {"00_cluster_check": check_cluster, "10_reward_by_phase": check_reward_by_phase, "11_aime": check_aime,
          "12_throughput": check_throughput, "13_kl_ess": check_kl_ess, "20_compare_to_amd": check_compare}


def test_notebook_00_on_its_defaults_writes_under_the_project_root_not_notebooks(page, lab, lane_dir):
    """The walkthrough's first step untouched: its default out_dir ("" = <root>/runs/notebooks) lands in the project's
    runs/, not in notebooks/runs/ where the kernel starts. A results file a person already has there is put back."""
    results = REPO_DIR / "runs" / "notebooks" / "00_cluster_check.results.json"
    kept = results.read_bytes() if results.is_file() else None
    made_folder = not results.parent.exists()
    try:
        view = run_in_browser(page, lab.login_url, "00_cluster_check", {}, lane_dir / "screenshots-defaults")
        record = load_results("00_cluster_check", results.parent)
        assert record["kernel_python"] == sys.executable and record["recipe"] == "tiny-cpu"
        assert f"{results}: " in view.text()  # the cell prints where it wrote
        assert not (NOTEBOOKS_DIR / "runs").exists()
    finally:
        if kept is None:
            results.unlink(missing_ok=True)
            if made_folder and not any(results.parent.iterdir()):
                results.parent.rmdir()
        else:
            results.write_bytes(kept)


def test_a_wrong_run_path_names_the_notebook_and_cell_and_keeps_the_screenshot(page, lab, lane_dir):
    screenshots = lane_dir / "screenshots-failure"
    with pytest.raises(LabFailure) as failure:
        run_in_browser(page, lab.login_url, "13_kl_ess", {"source": "../runs/no-such-run"}, screenshots)
    message = str(failure.value)
    assert message.startswith("notebook 13_kl_ess: cell 2 ('import pandas as pd') shows an error:")
    assert "MetricsError" in message and "no-such-run" in message
    assert "notebook 13_kl_ess: cells 3, 4, 6, 8, 10, 11 did not run after it" in message
    assert f"screenshot: {screenshots / '13_kl_ess.png'}" in message
    assert (screenshots / "13_kl_ess.png").stat().st_size > 10_000
