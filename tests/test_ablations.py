"""The ablation analysis on hand-built runs (exact numbers), the arms' recipes, and notebook 14's declarations.

The 15-minute notebook itself is not run here (`make ablations` runs it)."""

import json
from pathlib import Path

import pytest

from repro.studies import ablations
from repro.analysis.frame import frames_from_rows
from repro.notebooks import NOTEBOOKS_DIR, notebook_parameters
from repro.notebooks.chain import CHAIN
from repro.notebooks.parameters import declared_parameters
from repro.recipes import load_recipe


def _run(accuracy, kl, step_s, counts, start_counts=(2, 2, 2)):
    rows = [{"kind": "eval", "step": 0, "eval/avg@8": sum(start_counts) / (8 * len(start_counts)),
             "eval/correct_counts": list(start_counts), "eval/samples_per_problem": 8}]
    for step, (acc, k) in enumerate(zip(accuracy, kl), start=1):
        rows.append({"kind": "train", "step": step, "reward/accuracy": acc, "rollout_corr/kl": k,
                     "rollout_corr/k3_kl": k / 2, "rollout_corr/rollout_is_eff_sample_size": 1 - k,
                     "rollout_corr/rollout_is_ratio_fraction_high": 0.0, "timing_s/step": step_s * step})
    rows.append({"kind": "eval", "step": len(accuracy), "eval/avg@8": sum(counts) / (8 * len(counts)),
                 "eval/correct_counts": list(counts), "eval/samples_per_problem": 8})
    return frames_from_rows(rows, Path("synthetic"))


RUNS = {  # 4 steps, phases of 2; avg@8 counts all equal so the bootstrap band is a point
    ("baseline", 0): _run([0.25, 0.5, 0.5, 0.75], [0.01, 0.01, 0.02, 0.02], 1.0, [4, 4, 4]),
    ("baseline", 1): _run([0.5, 0.5, 0.5, 0.5], [0.01, 0.03, 0.01, 0.03], 2.0, [5, 5, 5]),
    ("r3-off", 0): _run([0.25, 0.25, 0.25, 0.25], [0.1, 0.1, 0.1, 0.1], 1.0, [4, 4, 4]),
    ("r3-off", 1): _run([0.5, 0.5, 0.25, 0.25], [0.2, 0.2, 0.2, 0.2], 1.0, [6, 6, 6]),
}


def test_runs_table_exact():
    table = ablations.runs_table(RUNS, phase_len=2)
    assert list(zip(table["arm"], table["seed"])) == [("baseline", 0), ("baseline", 1), ("r3-off", 0), ("r3-off", 1)]
    first = table.iloc[0]
    assert (first["phase1"], first["phase2"]) == (0.375, 0.625)
    assert (first["avg_start"], first["avg_end"], first["avg_end_low"], first["avg_end_high"]) == (0.25, 0.5, 0.5, 0.5)
    assert first["eval_step"] == 4 and first["kl"] == pytest.approx(0.015) and first["k3_kl"] == pytest.approx(0.0075)
    assert first["ess"] == pytest.approx(0.985) and first["step_s"] == 2.5  # median of 1, 2, 3, 4
    assert table.iloc[3]["avg_end"] == 0.75


def test_arm_means_ranges_and_seed_noise():
    arms = ablations.arm_table(ablations.runs_table(RUNS, phase_len=2))
    cell = arms.set_index(["arm", "metric"])
    assert cell.loc[("baseline", "phase2"), ["mean", "seed_min", "seed_max"]].tolist() == [0.5625, 0.5, 0.625]
    assert cell.loc[("r3-off", "kl"), ["mean", "seed_min", "seed_max"]].tolist() == pytest.approx([0.15, 0.1, 0.2])
    diffs = ablations.versus_baseline(arms).set_index(["arm", "metric"])
    # KL: r3-off's seeds 0.1..0.2 against the baseline's 0.015..0.02: disjoint
    assert diffs.loc[("r3-off", "kl"), "difference"] == pytest.approx(0.15 - 0.0175)
    assert bool(diffs.loc[("r3-off", "kl"), "exceeds_seed_noise"])
    # phase 2: 0.25 both seeds vs 0.5..0.625: disjoint; avg@8 end: 0.5..0.75 vs 0.5..0.625: overlapping
    assert bool(diffs.loc[("r3-off", "phase2"), "exceeds_seed_noise"])
    assert not bool(diffs.loc[("r3-off", "avg_end"), "exceeds_seed_noise"])
    lines = ablations.findings(ablations.versus_baseline(arms))
    assert any(line.startswith("r3-off: kl 0.15 vs baseline 0.0175") for line in lines)
    assert ablations.band_width(ablations.runs_table(RUNS, 2), "avg_end") == 0.25


def test_one_seed_never_exceeds_noise_and_no_baseline_is_an_error():
    one_seed = {k: v for k, v in RUNS.items() if k[1] == 0}
    diffs = ablations.versus_baseline(ablations.arm_table(ablations.runs_table(one_seed, 2)))
    assert not diffs["exceeds_seed_noise"].any()
    assert ablations.findings(diffs)[0].startswith("No arm differs")
    only_r3 = {k: v for k, v in RUNS.items() if k[0] == "r3-off"}
    with pytest.raises(Exception, match="no 'baseline' arm"):
        ablations.versus_baseline(ablations.arm_table(ablations.runs_table(only_r3, 2)))


def test_every_arm_is_a_valid_recipe_that_changes_one_setting():
    base = load_recipe("tiny-cpu", ablations.arm_overrides(ablations.arm_by_name("baseline"), 1, 30, 10))
    assert (base.seed, base.steps, base.eval.every_steps, base.checkpoint.every_steps) == (1, 30, 10, 30)
    changed = {}
    for arm in ablations.ARMS:
        recipe = load_recipe("tiny-cpu", ablations.arm_overrides(arm, 1, 30, 10))
        changed[arm.name] = (recipe.routing_replay.enabled, recipe.rollout_correction.mode,
                             recipe.rollout_correction.threshold, recipe.rollout.logprobs_mode,
                             recipe.algorithm.clip_ratio_c)
    amd = ("raw", None)  # AMD's conventions: vLLM's default raw log-probs, no dual-clip
    assert changed == {"baseline": (True, "token", 2.0, *amd), "r3-off": (False, "token", 2.0, *amd),
                       "tis-sequence": (True, "sequence", 2.0, *amd), "tis-off": (True, "none", 2.0, *amd),
                       "cap-1.5": (True, "token", 1.5, *amd), "cap-5.0": (True, "token", 5.0, *amd),
                       "processed-logprobs": (True, "token", 2.0, "processed", None),
                       "dual-clip": (True, "token", 2.0, "raw", 3.0)}
    with pytest.raises(ValueError, match="unknown ablation arm 'r4'"):
        ablations.arm_by_name("r4")


def test_notebook_14_declares_its_parameters_and_stays_out_of_the_chain():
    path = NOTEBOOKS_DIR / "14_ablations.ipynb"
    nb = json.loads(path.read_text())
    declared = declared_parameters("14_ablations")
    assert set(notebook_parameters("14_ablations")) == set(declared)  # papermill parses every line of the cell
    assert declared["arms"] == list(ablations.ARM_NAMES) and len(declared["seeds"]) >= 2
    assert declared["steps"] % declared["phase_len"] == 0 and declared["run"] is True
    assert "14_ablations" not in CHAIN  # `make ablations`, not `make repro`
    sources = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "ablations.run_ablations" in sources and "load_source" in sources
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert "\nablations:" in makefile and "14_ablations" in makefile
