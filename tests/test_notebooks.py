"""The notebook suite: committed clean, executed with papermill on a small run, and the numbers each notebook
records equal what repro.analysis computes from the same log.

One chain (02 -> 03 -> 10 -> 11 -> 12 -> 13 -> 20) runs once per module on a tiny in-process run: the smoke run
(3 steps) writes into the run dir and the full run (03) resumes it for a 4th step, so the resume path and the
live plot's pre-filled rows are exercised too. 00/01 belong to their own tests.
"""

import json
import math
import sys
from pathlib import Path

import pytest

import repro
from repro.analysis import compare_to_amd, load_run
from repro.analysis import summary
from repro.notebooks import (ANALYSIS, CHAIN, NOTEBOOKS_DIR, RUNS, NotebookError, execute_notebook, load_results,
                             record_results, run_chain, venv_kernel_name)
from repro.analysis.plots import FIGURE_NAMES
from repro.reference import amd_value

OURS = RUNS + ANALYSIS  # repro.notebooks.catalog
# the smallest run that still has GRPO groups, an evaluation and checkpoints: ~25 s a step on 2 busy cores
SMALL = ["algorithm.prompts_per_step=4", "algorithm.responses_per_prompt=2", "eval.samples_per_problem=1",
         "eval.at_start=false", "eval.every_steps=100", "checkpoint.every_steps=100"]
STEPS = 4


def _notebooks():
    return sorted(NOTEBOOKS_DIR.glob("*.ipynb"))


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.stem)
def test_notebook_committed_without_outputs_and_one_parameters_cell(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), f"{path.name} has outputs"
    assert sum("parameters" in c.get("metadata", {}).get("tags", []) for c in code) == 1


def test_our_notebooks_exist_and_are_in_the_chain():
    for name in OURS:
        assert (NOTEBOOKS_DIR / f"{name}.ipynb").is_file() and name in CHAIN


@pytest.mark.parametrize("name", OURS)
def test_papermill_reads_every_parameter_the_cell_declares(name):
    """A line papermill cannot parse (e.g. '=' or quotes in its comment) is silently missing from its inspection,
    and then neither the chain nor notebook_setup would know the parameter. The cell is the only declaration:
    its assignments, read with ast, must all be there."""
    import ast

    from repro.notebooks import notebook_parameters, notebook_path

    cell = next(c for c in json.loads(notebook_path(name).read_text())["cells"]
                if "parameters" in c.get("metadata", {}).get("tags", []))
    assigned = set()
    for node in ast.parse("".join(cell["source"])).body:
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        assigned |= {t.id for t in targets if isinstance(t, ast.Name)}
    assert assigned and set(notebook_parameters(name)) == assigned


def test_venv_kernel_starts_this_interpreter():
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(venv_kernel_name())
    assert spec.argv[0] in ("python", "python3") or Path(spec.argv[0]).resolve() == Path(sys.executable).resolve()


def test_record_results_is_plain_json_written_atomically(tmp_path):
    import numpy as np

    path = record_results("xx", {"a": np.float32(0.5), "b": float("nan"), "c": {1: np.arange(3)}, "p": tmp_path},
                          tmp_path)
    assert path == tmp_path / "xx.results.json" and not list(tmp_path.glob(".*tmp"))
    data = load_results("xx", tmp_path)
    assert data["a"] == 0.5 and data["b"] is None and data["c"] == {"1": [0, 1, 2]} and data["p"] == str(tmp_path)
    assert data["notebook"] == "xx" and data["kernel_python"] == sys.executable


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("nbrun")
    result = run_chain(run_dir, "tiny-cpu", STEPS, overrides=SMALL, in_process=True,
                       figures_dir=run_dir / "figures", skip=("00_cluster_check", "01_fp8_conversion"),
                       smoke_dir=run_dir, log=lambda line: None)
    return result, load_run(run_dir)


@pytest.mark.slow
def test_chain_runs_every_notebook_in_order_and_says_where_outputs_are(chain):
    result, _ = chain
    assert list(result.results) == list(OURS)
    for name in OURS:
        assert (result.notebooks_dir / f"{name}.ipynb").is_file()
        assert (result.notebooks_dir / f"{name}.results.json").is_file()
        # the kernel was this venv's interpreter, not some other python3 on the machine
        assert Path(result.results[name]["kernel_python"]).resolve() == Path(sys.executable).resolve()
    text = result.describe()
    assert str(result.notebooks_dir) in text and str(result.figures_dir) in text and str(result.report) in text


@pytest.mark.slow
def test_smoke_run_records_three_rows_with_the_logged_keys(chain):
    result, frames = chain
    smoke = result.results["02_smoke_run"]
    assert smoke["train_rows"] == 3 and smoke["logged_steps"] == [1, 2, 3]
    for key in ("reward/accuracy", "rollout_corr/kl", "rollout_corr/rollout_is_eff_sample_size",
                "perf/rollout_tokens_per_s", "timing_s/step", "actor/loss"):
        assert key in smoke["keys"]
    assert smoke["reward_accuracy"] == pytest.approx(frames.train.loc[1:3, "reward/accuracy"].tolist())
    assert smoke["kl"] == pytest.approx(frames.train.loc[1:3, "rollout_corr/kl"].tolist())


@pytest.mark.slow
def test_full_run_resumes_and_draws_the_live_plot(chain):
    result, frames = chain
    full = result.results["03_full_run"]
    assert full["steps"] == STEPS and full["train_rows"] == STEPS == len(frames.train)
    assert full["new_steps"] == 1 and full["live_points"] == STEPS and full["live_redraws"] >= 1
    # tiny-cpu evaluates after step 1 as AMD's run did (LumenRL's EvalCallback), then after the smoke run's last
    # step (3) and the run's (4)
    assert full["eval_steps"] == [1, 3, 4] == list(frames.eval.index)
    assert "step_000004" in full["checkpoints"]
    assert full["final_reward_accuracy"] == pytest.approx(frames.train["reward/accuracy"].iloc[-1])
    # the live figure's display was updated in place under papermill: the executed notebook holds a PNG
    executed = json.loads((result.notebooks_dir / "03_full_run.ipynb").read_text())
    images = [o for c in executed["cells"] for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images


@pytest.mark.slow
def test_reward_by_phase_records_the_summary_phase_means(chain, tmp_path):
    result, frames = chain
    accuracy, label = frames.train["reward/accuracy"], frames.label
    rec = result.results["10_reward_by_phase"]
    expected = summary.phase_means(accuracy, 25)
    assert rec["sources"] == [label]
    assert rec["phase_means"] == {label: {"1": pytest.approx(expected.loc[1, "mean"])}}
    assert rec["phase_steps"] == {label: {"1": STEPS}}
    assert rec["amd_phase_means"] == {"1": 0.45, "2": 0.53, "3": 0.59}
    assert rec["extremes"] == {label: summary.step_extremes(accuracy)}
    # a shorter phase gives several phases, each the summary's mean
    again = execute_notebook("10_reward_by_phase", tmp_path, {"source": str(result.run_dir), "out_dir": str(tmp_path),
                                                              "figures_dir": str(tmp_path), "phase_len": 2})
    expected = summary.phase_means(accuracy, 2)
    assert again["phase_means"][label] == {str(p): pytest.approx(m) for p, m in expected["mean"].items()}
    assert len(again["phase_means"][label]) == 2


@pytest.mark.slow
def test_aime_records_avg_and_bootstrap_intervals_per_checkpoint(chain):
    result, frames = chain
    rec, label = result.results["11_aime"], frames.label
    table = summary.eval_table(frames)
    assert rec["avg_key"] == {label: "eval/avg@1"} and rec["eval_steps"] == {label: [1, 3, 4]}
    for step, row in table.iterrows():
        s, avg, low, high = str(step), rec["avg"][label], rec["ci_low"][label], rec["ci_high"][label]
        assert avg[s] == pytest.approx(row["avg"]) and rec["problems"][label][s] == 30
        assert low[s] == pytest.approx(row["low"]) and high[s] == pytest.approx(row["high"])
        assert low[s] <= avg[s] <= high[s]
    assert (rec["amd_start"], rec["amd_end"]) == (0.30, 0.492)


@pytest.mark.slow
def test_throughput_and_mismatch_records_equal_the_summary(chain):
    result, frames = chain
    tp, label = result.results["12_throughput"], frames.label
    expected = summary.throughput_summary(frames.train["perf/rollout_tokens_per_s"])
    assert tp["throughput"] == {label: {k: pytest.approx(v) for k, v in expected.items()}}
    assert tp["throughput"][label]["mean"] > 0 and tp["amd_throughput"]["mean"] == 311
    assert tp["time_to_train"][label]["unit"] == "core-hours"
    mm = result.results["13_kl_ess"]
    assert mm["kl_step"] == mm["ess_step"] == mm["k3_step"] == {label: STEPS}
    assert mm["kl"][label] == pytest.approx(frames.train["rollout_corr/kl"].iloc[-1])
    assert mm["k3"][label] == pytest.approx(frames.train["rollout_corr/k3_kl"].iloc[-1])
    assert mm["ess"][label] == pytest.approx(frames.train["rollout_corr/rollout_is_eff_sample_size"].iloc[-1])
    assert 0 < mm["ess"][label] <= 1 and (mm["amd_kl_step75"], mm["amd_ess_step75"]) == (0.4706, 0.791)
    # LumenRL's per-position buckets, logged every step: the tiny task's answers (<= 16 tokens) fill only the first
    by_position = summary.mismatch_by_position(frames)
    assert list(by_position.index) == ["0–127"] and by_position.loc["0–127", "steps"] == STEPS
    assert by_position.loc["0–127", "tokens"] == frames.train["perf/generated_tokens"].sum()
    recorded = mm["mismatch_by_position"][label]["0–127"]
    assert recorded == {k: pytest.approx(v) for k, v in by_position.loc["0–127"].to_dict().items()}
    assert recorded["kl"] == pytest.approx(frames.train["rollout_corr/kl"].mul(
        frames.train["perf/generated_tokens"]).sum() / frames.train["perf/generated_tokens"].sum())
    assert sorted(Path(p).name for p in mm["position_figures"]) == \
        ["mismatch_by_position.png", "mismatch_by_position.svg"]


@pytest.mark.slow
def test_compare_records_the_comparison_rows_and_writes_the_report(chain):
    result, frames = chain
    rec = result.results["20_compare_to_amd"]
    table = compare_to_amd(frames)
    assert rec["metrics"] == table["metric"].tolist() and rec["sources"] == [frames.label]
    rows = rec["rows"][frames.label]
    assert len(rows) == len(table) > 5
    for got, want in zip(rows, table.to_dict("records")):
        for column in ("amd", "run"):  # NaN (the k3 row has no AMD value; a phase the run lacks) is recorded as null
            assert (got[column] is None and math.isnan(want[column])) or got[column] == pytest.approx(want[column])
    assert rows[0]["amd"] == amd_value("reward_acc_phase1")
    assert Path(rec["report"]) == result.report == result.run_dir / "comparison.md"
    assert "mechanism check, not a replication" in result.report.read_text()


@pytest.mark.slow
def test_figures_exist_as_png_and_svg(chain):
    result, _ = chain
    for name in FIGURE_NAMES:
        for ext in ("png", "svg"):
            assert (result.figures_dir / f"{name}.{ext}").stat().st_size > 5_000
    recorded = [p for n in ("10_reward_by_phase", "11_aime", "12_throughput", "13_kl_ess")
                for p in result.results[n]["figures"]]
    assert sorted(Path(p).name for p in recorded) == sorted(f"{n}.{e}" for n in FIGURE_NAMES for e in ("png", "svg"))


@pytest.mark.slow
def test_a_failing_notebook_is_named_with_its_cell(tmp_path):
    with pytest.raises(NotebookError) as err:
        execute_notebook("13_kl_ess", tmp_path, {"source": str(tmp_path / "no-such-run")})
    message = str(err.value)
    assert "13_kl_ess" in message and "cell" in message and "MetricsError" in message
    assert "no such file or folder" in message and str(tmp_path / "13_kl_ess.ipynb") in message
    assert not (tmp_path / "13_kl_ess.results.json").exists()


DATA = Path(__file__).parent / "data"


@pytest.mark.slow
def test_analysis_notebooks_read_imported_logs_several_at_once(tmp_path):
    """The walkthroughs on other frameworks' logs: a LumenRL console log, a verl JSONL and W&B panel exports, each
    recorded value equal to what repro.analysis computes from the same files."""
    from repro.analysis import load_sources

    sources = [f"lumenrl={DATA / 'lumenrl' / 'train.log'}", f"verl={DATA / 'verl' / 'metrics.jsonl'}",
               f"panels=wandb:{DATA / 'wandb'}/panel_*.csv"]
    frames = load_sources(sources)
    params = {"source": sources, "out_dir": str(tmp_path), "figures_dir": str(tmp_path / "figures")}
    mm = execute_notebook("13_kl_ess", tmp_path, params)
    assert mm["sources"] == ["lumenrl", "verl", "panels"]
    assert mm["kl"] == {"lumenrl": -0.0007, "verl": 0.0015, "panels": -0.0007}
    assert mm["kl_step"] == {"lumenrl": 12, "verl": 6, "panels": 10}
    assert mm["k3"] == {"lumenrl": 0.0021, "verl": 0.0012, "panels": None}  # the panels hold no rollout_corr/k3_kl
    rec = execute_notebook("20_compare_to_amd", tmp_path, {**params, "report": str(tmp_path / "comparison.md")})
    for f in frames:
        assert [r["metric"] for r in rec["rows"][f.label]] == compare_to_amd(f)["metric"].tolist()
        assert rec["notes"][f.label][0].startswith(f"{int(f.train.index.max())} steps logged, fewer than AMD's 75")
    assert rec["rows"]["panels"][7]["note"] == "no `perf/rollout_tokens_per_s` in this source"
    assert (tmp_path / "comparison.md").read_text().startswith("# lumenrl, verl, panels: comparison")
    assert sorted(p.name for p in (tmp_path / "figures").glob("*.svg")) == ["train_rollout_mismatch.svg"]


def test_unknown_chain_notebook_is_refused(tmp_path):
    with pytest.raises(NotebookError, match="not in the chain"):
        run_chain(tmp_path, notebooks=["99_nope"], log=lambda line: None)


@pytest.mark.slow
def test_notebook_13_draws_kl_by_position_from_a_lumenrl_log_with_the_buckets(tmp_path):
    """LumenRL (2232f55 on) logs rollout_corr/pos_* every step: notebook 13 tables and draws all five buckets, each
    equal to repro.analysis's token-weighted mean; a source without them (verl) is named, not drawn."""
    from repro.analysis import load_sources

    log = DATA / "lumenrl" / "synthetic_positions_75.log"  # synthetic, in LumenRL's console format
    sources = [f"lumenrl={log}", f"verl={DATA / 'verl' / 'metrics.jsonl'}"]
    params = {"source": sources, "out_dir": str(tmp_path), "figures_dir": str(tmp_path / "figures")}
    mm = execute_notebook("13_kl_ess", tmp_path, params)
    table = summary.mismatch_by_position(load_sources(sources)[0])
    assert list(table.index) == ["0–127", "128–511", "512–1023", "1024–2047", "2048–4095"]
    assert set(mm["mismatch_by_position"]) == {"lumenrl"}  # verl logs no buckets
    for bucket, row in table.iterrows():
        assert mm["mismatch_by_position"]["lumenrl"][bucket] == {k: pytest.approx(v) for k, v in row.to_dict().items()}
    assert [Path(p).name for p in mm["position_figures"]] == ["mismatch_by_position.png", "mismatch_by_position.svg"]
    assert all(Path(p).stat().st_size > 5_000 for p in mm["position_figures"])
