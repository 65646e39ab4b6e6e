"""Other published DeepSeek-V4 RL runs beside a run (repro.reference.PUBLISHED, repro.analysis.compare_published):
each number is in the sentence it came from, and each row's value is computed from a hand-built run exactly."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from repro.analysis import load_run
from repro.analysis.compare_published import abs_logprob_diff_by_step, compare_to_published, pass_at_k
from repro.errors import ReproError
from repro.recipes import dump_recipe, load_recipe
from repro.reference import PUBLISHED, published_run


@pytest.mark.parametrize("name", [n for n in PUBLISHED if n != "amd"])
def test_each_number_is_in_its_quote_and_each_source_has_a_link(name):
    run = published_run(name)
    assert run.url.startswith("https://") and run.source and run.setup and run.caveats
    for key, ref in run.metrics.items():
        assert f"{ref.value:g}" in ref.quote or f"{ref.value * 100:g}%" in ref.quote, key
        assert ref.measures, key


def test_miles_numbers():
    m = {k: r.value for k, r in published_run("miles-mi355x").metrics.items()}
    assert m == {"aime_pass1_start": 0.39, "aime_pass1_end": 0.49, "aime_pass8_start": 0.53, "aime_pass8_end": 0.67,
                 "mean_abs_logprob_diff": 0.09, "online_reward_step_min": 0.36, "online_reward_step_max": 0.77}
    assert published_run("verl-veomni").metrics["kl_k1"].value == 0.005346724297851324
    with pytest.raises(ReproError, match="--reference 'nope': no such published run; known: amd, miles-mi355x"):
        published_run("nope")


def test_pass_at_k_is_the_unbiased_estimator():
    # 3 problems, 8 samples: c = 0, 1, 8. pass@8: 0, 1, 1; pass@1: c / 8; pass@2: 1 - C(8 - c, 2) / C(8, 2)
    assert pass_at_k([0, 1, 8], 8, 8) == pytest.approx(2 / 3)
    assert pass_at_k([0, 1, 8], 8, 1) == pytest.approx((0 + 1 / 8 + 1) / 3)
    assert pass_at_k([0, 1, 8], 8, 2) == pytest.approx((0 + (1 - 21 / 28) + 1) / 3)
    with pytest.raises(ValueError, match="pass@9 needs"):
        pass_at_k([1], 8, 9)


def hand_built_run(tmp_path):
    """Two steps with two position buckets each, three evaluations of 3 problems x 8 samples."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    dump_recipe(load_recipe("tiny-cpu", ["steps=2"]), run_dir / "recipe.yaml")
    rows = [{"kind": "eval", "step": 0, "eval/avg@8": 9 / 24, "eval/correct_counts": [0, 1, 8],
             "eval/num_problems": 3, "eval/samples_per_problem": 8}]
    for step, (acc, kl, k3, d0, n0, d1, n1) in enumerate([(0.5, 0.01, 0.002, 0.1, 100, 0.3, 300),
                                                         (0.25, -0.02, 0.004, 0.2, 50, 0.4, 150)], start=1):
        rows.append({"kind": "train", "step": step, "reward/accuracy": acc, "rollout_corr/kl": kl,
                     "rollout_corr/k3_kl": k3, "rollout_corr/pos_0_127/abs_diff": d0,
                     "rollout_corr/pos_0_127/tokens": n0, "rollout_corr/pos_128_511/abs_diff": d1,
                     "rollout_corr/pos_128_511/tokens": n1})
        rows.append({"kind": "eval", "step": step, "eval/avg@8": (step + 9) / 24,
                     "eval/correct_counts": [step, 1, 8], "eval/num_problems": 3, "eval/samples_per_problem": 8})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def test_rows_against_miles_on_a_hand_built_run(tmp_path):
    frames = load_run(hand_built_run(tmp_path))
    per_step = abs_logprob_diff_by_step(frames)
    assert per_step.tolist() == pytest.approx([(10 + 90) / 400, (10 + 60) / 200])  # token-weighted buckets
    table = compare_to_published(frames, published_run("miles-mi355x")).set_index("metric")
    assert table.loc["held-out pass@1 (avg@k), first evaluation", "run"] == pytest.approx(9 / 24)
    assert table.loc["held-out pass@1 (avg@k), first evaluation", "step"] == 0
    end = table.loc["held-out pass@1 (avg@k), step 100"]
    assert (end["run"], end["step"]) == (pytest.approx(11 / 24), 2)
    assert end["note"] == "step 2, the reference's is step 100"
    assert table.loc["held-out pass@8, first evaluation", "run"] == pytest.approx(2 / 3)  # problem 0 never solved
    assert table.loc["held-out pass@8, step 100", "run"] == pytest.approx(1.0)            # c = 2, 1, 8
    row = table.loc["mean abs(Δ log p), train vs rollout"]
    assert row["run"] == pytest.approx((0.25 + 0.35) / 2) and row["amd"] == 0.09
    assert table.loc["reward, lowest step", "run"] == 0.25 and table.loc["reward, lowest step", "step"] == 2
    assert table.loc["reward, highest step", "run"] == 0.5
    verl = compare_to_published(frames, published_run("verl-veomni")).set_index("metric")
    assert (verl.loc["train-rollout KL, k1, first step", "run"], verl.loc["train-rollout KL, k3, first step", "run"]) \
        == (0.01, 0.002)
    assert math.isclose(verl.loc["train-rollout KL, k1, first step", "difference"], 0.01 - 0.005346724297851324)


def test_compare_cli_writes_the_report_against_a_reference(tmp_path):
    run_dir = hand_built_run(tmp_path)
    out = tmp_path / "miles.md"
    done = subprocess.run([sys.executable, "-m", "repro", "compare", str(run_dir), "--reference", "miles-mi355x",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    text = out.read_text()
    assert text.startswith("# run: comparison with Miles on 4 x 8 MI355X")
    assert "https://lmsys.org/blog/2026-07-10-rocm-miles-dsv4/" in text and \
        "| metric | miles-mi355x | this run |" in text
    assert "is a tiny CPU run: a mechanism check, not a replication" in text
    bad = subprocess.run([sys.executable, "-m", "repro", "compare", str(run_dir), "--reference", "nope"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "no such published run" in bad.stderr


def test_notebook_20_sets_a_run_beside_another_reference(tmp_path):
    """Notebook 20 with ``reference`` (AMD's stays the default): the recorded rows are compare_to_published's."""
    from repro.notebooks import execute_notebook

    run_dir = hand_built_run(tmp_path)
    params = {"source": str(run_dir), "out_dir": str(tmp_path), "report": str(tmp_path / "miles.md"),
              "reference": "miles-mi355x"}
    rec = execute_notebook("20_compare_to_amd", tmp_path, params)
    expected = compare_to_published(load_run(run_dir), published_run("miles-mi355x"))
    assert rec["reference"] == "miles-mi355x"
    assert [r["metric"] for r in rec["rows"]["run"]] == expected["metric"].tolist()
    assert rec["rows"]["run"][4]["run"] == pytest.approx(0.3)
    assert (tmp_path / "miles.md").read_text().startswith("# run: comparison with Miles")


def test_the_report_page_sets_the_run_beside_the_reference(tmp_path):
    from repro.report_page import ReportError, write_report_page

    with pytest.warns(UserWarning, match="rollout_throughput not drawn"):  # the hand-built run logs no throughput
        page = write_report_page(str(hand_built_run(tmp_path)), tmp_path / "report", reference="verl-veomni")
    text = page.read_text()
    assert "<title>run: comparison with verl + VeOmni" in text and "0.005347" in text
    with pytest.raises(ReproError, match="no such published run"):
        write_report_page(str(tmp_path / "run"), tmp_path / "other", reference="nope")
    assert not (tmp_path / "other").exists() and ReportError
