"""repro run with engine verl, end to end on a CPU, through a STAND-IN for verl's trainer
(tests/standins/verl_main_ppo.py: not verl's trainer; it logs through verl's own Tracking(["console", "file"]) and
saves in verl's checkpoint layout and order). The overrides are composed and checked by verl's own code first, as
for a real launch. What is shown: metrics.jsonl streamed while it runs equals what reading the finished file gives,
across a crash while saving and a resume (a fresh file per attempt, since verl truncates its file at every start);
the resume takes the newest complete checkpoint by resume_path and names the half-written one; a finished run is
not started again. What is not covered: verl's Ray workers, GPUs, its real metrics."""

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from repro.analysis.frame import load_run
from repro.analysis.importers import read_verl_jsonl
from repro.engines import plan_run, run_recipe
from repro.recipes import load_recipe
from repro.verl import launch
from repro.verl.launch import VerlError

STANDINS = Path(__file__).resolve().parents[1] / "standins"


@pytest.fixture
def recipe(tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "ENTRY_MODULE", "verl_main_ppo")  # the stand-in, in place of verl's main_ppo
    model = tmp_path / "model"
    model.mkdir()
    dapo = [{"data_source": "math_dapo", "prompt": [{"role": "user", "content": f"What is {i}+1?"}],
             "reward_model": {"ground_truth": str(i + 1)}, "extra_info": {"index": i}} for i in range(40)]
    aime = [{"problem": f"Problem {i}", "answer": str(i)} for i in range(30)] * 2
    pq.write_table(pa.Table.from_pylist(dapo), tmp_path / "dapo.parquet")
    pq.write_table(pa.Table.from_pylist(aime), tmp_path / "aime.parquet")
    return load_recipe("amd-dsv4-flash-mi308x", [
        "engine=verl", "steps=5", "checkpoint.every_steps=2", "eval.every_steps=3", f"model.path={model}",
        f"data.train.path={tmp_path / 'dapo.parquet'}", f"data.eval.path={tmp_path / 'aime.parquet'}",
        "cluster.ray_address=null", f"verl.env={{PYTHONPATH: {STANDINS}, STANDIN_CRASH_SAVING_AT: '4'}}"])


def test_a_crash_while_saving_resumes_from_the_last_complete_checkpoint_and_streams_every_step(recipe, tmp_path):
    run_dir = tmp_path / "run"
    said = []
    with pytest.raises(VerlError, match=r"(?s)exited with status 3 after logging step 3.*last complete verl checkpoint "
                                        r"is step 2"):
        run_recipe(recipe, run_dir, say=said.append)
    root = run_dir / "checkpoints"
    assert (root / "global_step_4" / "actor").is_dir() and not (root / "global_step_4" / "data.pt").exists()
    plan = plan_run(recipe, run_dir, resume=True)
    assert plan.checkpoint.step == 2 and plan.dropped_steps == [3] and plan.ignored == ["global_step_4 (no data.pt)"]
    run_recipe(recipe, run_dir, resume=True, say=said.append)

    first, second = run_dir / "verl" / "metrics.attempt-1.jsonl", run_dir / "verl" / "metrics.attempt-2.jsonl"
    assert [json.loads(x)["step"] for x in first.read_text().splitlines()] == [1, 2, 3]
    assert [json.loads(x)["step"] for x in second.read_text().splitlines()] == [3, 4, 5]  # verl's own file
    written = (run_dir / "verl" / "overrides.txt").read_text().splitlines()
    assert f"trainer.resume_from_path={root.resolve() / 'global_step_2'}" in written
    assert "trainer.resume_mode=resume_path" in written and "trainer.resume_mode=auto" not in written

    # the finished file as a reader would assemble it: attempt 1 up to the checkpoint, then attempt 2
    finished = tmp_path / "finished.jsonl"
    lines = [x for x in first.read_text().splitlines() if json.loads(x)["step"] <= 2] + second.read_text().splitlines()
    finished.write_text("\n".join(lines) + "\n")
    expected, streamed = read_verl_jsonl(finished), load_run(run_dir)
    columns = sorted(expected.train.columns)
    pd.testing.assert_frame_equal(streamed.train[columns], expected.train[columns], check_dtype=False)
    pd.testing.assert_frame_equal(streamed.eval[sorted(expected.eval.columns)],
                                  expected.eval[sorted(expected.eval.columns)], check_dtype=False)
    assert list(streamed.train.index) == [1, 2, 3, 4, 5] and list(streamed.eval.index) == [3, 5]
    assert streamed.train.loc[2, "actor/grad_norm"] != streamed.train.loc[2, "actor/grad_norm"]  # NaN -> null -> NaN
    assert not streamed.step_time_includes_eval  # verl times validation apart (timing_s/testing)
    assert "step:5 - " in (run_dir / "logs" / "verl.log").read_text()  # verl's console logger, via the stand-in

    outcome = run_recipe(recipe, run_dir, resume=True, say=said.append)
    assert outcome.already_finished and any("the run is finished" in s for s in said)


def test_verls_caveats_reach_the_comparison(recipe, tmp_path):
    from repro.analysis.caveats import source_notes

    run_dir = tmp_path / "run"
    run_recipe(recipe.model_copy(update={"verl": recipe.verl.model_copy(update={"env": {
        "PYTHONPATH": str(STANDINS)}})}), run_dir, say=lambda s: None)
    notes = " ".join(source_notes(load_run(run_dir)))
    assert "never evaluates after the first update" in notes and "excludes its evaluation" in notes
    assert "no KL by response position" in notes

    from repro.cli import main  # `repro compare` and `repro figures` read the run as any other

    assert main(["compare", str(run_dir), "--out", str(tmp_path / "comparison.md")]) == 0
    report = (tmp_path / "comparison.md").read_text()
    assert "never evaluates after the first update" in report
    assert main(["figures", str(run_dir), "--out", str(tmp_path / "figures")]) == 0
    assert any(p.suffix == ".png" for p in (tmp_path / "figures").iterdir())
