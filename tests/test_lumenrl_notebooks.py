"""Notebooks 02/03 with engine="lumenrl", and 10-20 on the run they streamed -- on a STAND-IN for LumenRL.

The program started is tests/standins/lumenrl_trainer_main.py, not LumenRL (which needs AMD's images and GPUs); it
writes LumenRL's log and checkpoints at a set pace. The run crashes after step 5 (checkpoint at step 4), notebook 03
resumes it through the one entry point and draws the live plot from the streamed rows, and the analysis notebooks
read the run directory as they read our own runs: every recorded value equals what repro.analysis computes from it.
"""

import json
import math

import pytest

from lumenrl_support import make_standin_checkout, standin_overrides
from repro.analysis import compare_to_amd, load_run, summary
from repro.lumenrl.launch import LumenRLError
from repro.notebooks import execute_notebook
from repro.recipes import load_recipe
from repro.engines import run_recipe

AMD = "amd-dsv4-flash-mi308x"
STEPS = 8


@pytest.fixture(scope="module")
def streamed(tmp_path_factory):
    """A stand-in LumenRL run of 8 steps: crashed after step 5, then resumed by notebook 03."""
    tmp = tmp_path_factory.mktemp("lumenrl-nb")
    monkey = pytest.MonkeyPatch()
    monkey.setenv("LUMENRL_STANDIN_STEP_S", "0.3")
    checkout = make_standin_checkout(tmp)
    overrides = [o for o in standin_overrides(checkout, tmp / "inputs", STEPS, save_every=2, eval_every=4)
                 if o != "engine=lumenrl"]  # the notebooks' engine parameter sets it
    run_dir, out = tmp / "run", tmp / "out"
    monkey.setenv("LUMENRL_STANDIN_DIE_AFTER", "5")
    with pytest.raises(LumenRLError, match="exited with status 1 after logging step 5"):
        run_recipe(load_recipe(AMD, overrides + ["engine=lumenrl"]), run_dir, say=lambda line: None)
    monkey.delenv("LUMENRL_STANDIN_DIE_AFTER")
    full = execute_notebook("03_full_run", out, {"recipe": AMD, "run_dir": str(run_dir), "steps": STEPS,
                                                  "overrides": overrides, "engine": "lumenrl", "out_dir": str(out)})
    smoke = execute_notebook("02_smoke_run", out, {"recipe": AMD, "run_dir": str(tmp / "smoke"), "steps": 3,
                                                   "overrides": overrides, "engine": "lumenrl", "out_dir": str(out)})
    monkey.undo()
    return {"run_dir": run_dir, "out": out, "full": full, "smoke": smoke, "frames": load_run(run_dir)}


@pytest.mark.long
def test_notebook_03_resumes_lumenrl_and_its_live_plot_holds_every_streamed_step(streamed):
    full, frames = streamed["full"], streamed["frames"]
    assert (full["steps"], full["train_rows"]) == (STEPS, STEPS) and list(frames.train.index) == list(range(1, 9))
    assert (full["live_points"], full["new_steps"]) == (8, 4)  # 1-4 from the log as it stood, 5-8 streamed live
    # 1: the EvalCallback after the first update (eval.at_start -> eval.enabled); 4, 8: val_steps
    assert full["live_redraws"] >= 1 and full["eval_steps"] == [1, 4, 8]
    assert full["checkpoints"] == ["global_step_6", "global_step_8"]
    # the stand-in's formulas: a resumed attempt adds 0.001 to the accuracy
    assert full["final_reward_accuracy"] == pytest.approx(0.40 + 0.005 * 8 + 0.001)
    assert full["final_kl"] == pytest.approx(0.0004 * 8) == frames.train["rollout_corr/kl"].iloc[-1]
    executed = json.loads((streamed["out"] / "03_full_run.ipynb").read_text())
    images = [o for c in executed["cells"] for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images  # the live figure, updated in place under papermill
    text = "".join(o.get("text", "") if isinstance(o.get("text"), str) else "".join(o.get("text", []))
                   for c in executed["cells"] for o in c.get("outputs", []))
    assert "engine lumenrl" in text and "resuming from step 4" in text


@pytest.mark.long
def test_notebook_02_smoke_runs_lumenrl_for_three_steps(streamed):
    smoke = streamed["smoke"]
    assert smoke["train_rows"] == 3 and smoke["logged_steps"] == [1, 2, 3]
    assert smoke["reward_accuracy"] == pytest.approx([0.405, 0.41, 0.415])
    assert smoke["kl"] == pytest.approx([-0.0004, 0.0008, -0.0012])
    assert {"reward/accuracy", "rollout_corr/kl", "perf/rollout_tokens_per_s", "timing_s/step"} <= set(smoke["keys"])


@pytest.mark.long
def test_analysis_notebooks_read_the_streamed_run_as_the_library_does(streamed):
    run_dir, frames, out = streamed["run_dir"], streamed["frames"], streamed["out"]
    label = frames.label
    params = {"source": str(run_dir), "out_dir": str(out), "figures_dir": str(out / "figures")}
    accuracy = frames.train["reward/accuracy"]

    phases = execute_notebook("10_reward_by_phase", out, {**params, "phase_len": 4})
    expected = summary.phase_means(accuracy, 4)
    assert phases["phase_means"][label] == {str(p): pytest.approx(m) for p, m in expected["mean"].items()}
    assert phases["extremes"][label] == summary.step_extremes(accuracy)

    aime = execute_notebook("11_aime", out, params)
    table = summary.eval_table(frames)
    assert aime["avg_key"] == {label: "eval/avg@8"} and aime["eval_steps"] == {label: [1, 4, 8]}
    assert aime["avg"][label] == {str(s): pytest.approx(v) for s, v in table["avg"].items()}
    assert aime["avg"][label] == {"1": pytest.approx(0.31), "4": pytest.approx(0.34), "8": pytest.approx(0.38)}
    assert aime["problems"][label] == {"1": 0, "4": 0, "8": 0}  # LumenRL logs no per-problem counts: no bootstrap band

    throughput = execute_notebook("12_throughput", out, params)
    expected = summary.throughput_summary(frames.train["perf/rollout_tokens_per_s"])
    assert throughput["throughput"][label] == {k: pytest.approx(v) for k, v in expected.items()}
    ttt = summary.time_to_train(frames, steps=75)
    assert throughput["time_to_train"][label]["unit"] == "GPU-hours" and ttt["devices"] == 24
    assert throughput["time_to_train"][label]["eval_s_total"] == pytest.approx(ttt["eval_s_total"])

    mismatch = execute_notebook("13_kl_ess", out, params)
    assert mismatch["kl"][label] == pytest.approx(frames.train["rollout_corr/kl"].iloc[-1])
    assert mismatch["ess"][label] == pytest.approx(0.95 - 0.001 * 8) and mismatch["kl_step"][label] == 8

    compare = execute_notebook("20_compare_to_amd", out, {**params, "report": str(out / "comparison.md")})
    rows, want = compare["rows"][label], compare_to_amd(frames).to_dict("records")
    assert [r["metric"] for r in rows] == [w["metric"] for w in want]
    for got, expected_row in zip(rows, want):
        for column in ("amd", "run"):
            value = expected_row[column]
            assert (got[column] is None and math.isnan(value)) or got[column] == pytest.approx(value)
    report = (out / "comparison.md").read_text()
    assert "Streamed from LumenRL's console log" in report and "includes the evaluation time" in report
