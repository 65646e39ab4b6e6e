"""Sampler positions, the metrics log, checkpoint folders and run-directory checks: the pieces resume needs."""

import json
import random

import pytest
import torch

from repro import REPO_DIR
from repro.run.checkpoints import (driver_rng_state, latest_checkpoint, list_checkpoints, restore_driver_rng,
                                   save_checkpoint)
from repro.data.recipe_datasets import load_dataset
from repro.data.sampler import PromptSampler
from repro.errors import ReproError, TornLineWarning
from repro.run.metrics_log import MetricsLog
from repro.recipes import load_recipe
from repro.run.run_dir import checkpoint_bytes, prepare_run_dir


def test_sampler_epochs_and_resume():
    sampler = PromptSampler(10, 4, seed=1)
    batches = [sampler.next_batch() for _ in range(5)]
    assert all(len(b) == 4 for b in batches)
    assert sorted(batches[0] + batches[1]) == sorted(set(batches[0] + batches[1]))  # no repeat within an epoch
    assert sampler.state() == {"epoch": 2, "offset": 4, "seed": 1, "num_problems": 10}  # 2 batches/epoch, 2 left over
    resumed = PromptSampler(10, 4, seed=1)
    fresh = PromptSampler(10, 4, seed=1)
    for _ in range(3):
        fresh.next_batch()
    resumed.load_state(fresh.state())
    assert [resumed.next_batch() for _ in range(2)] == batches[3:]
    with pytest.raises(ValueError, match="sampler state is for seed 1 over 10 problems, this run has seed 2 over 10"):
        PromptSampler(10, 4, seed=2).load_state(fresh.state())
    with pytest.raises(ValueError, match="3 problems cannot fill a batch of 4"):
        PromptSampler(3, 4, seed=0)


def test_metrics_log_appends_truncates_and_warns_of_a_torn_line(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for step in range(1, 5):
        log.append({"kind": "train", "step": step, "x": step / 2, "bad": float("nan")})
    with open(log.path, "a") as handle:
        handle.write('{"kind": "train", "st')  # killed mid-write
    with pytest.warns(TornLineWarning, match=r"metrics\.jsonl:5: torn last line dropped"):
        rows = log.rows()
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[0]["bad"] is None
    assert log.truncate_after(2) == 2
    assert [r["step"] for r in log.rows()] == [1, 2]
    frame = __import__("pandas").read_parquet(log.write_parquet())
    assert list(frame["x"]) == [0.5, 1.0]
    log.path.write_text('{"step": 1}\n{"st\n{"step": 3}\n')  # corrupt before its end: not a kill
    with pytest.raises(ReproError, match=r"metrics\.jsonl:2: not a JSON row"):
        log.rows()


class FakeTrainer:
    def __init__(self, fail=False):
        self.fail = fail

    def save(self, directory):
        directory.mkdir()
        (directory / "model.safetensors").write_bytes(b"w")
        if self.fail:
            raise KeyboardInterrupt("killed while writing")


def test_checkpoints_are_atomic_and_pruned(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n')
    for step in (25, 50, 75):
        save_checkpoint(tmp_path / "ck", step, FakeTrainer(), {"sampler": {}}, metrics, keep_last=2)
    assert [c.step for c in list_checkpoints(tmp_path / "ck")] == [50, 75]
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path / "ck", 100, FakeTrainer(fail=True), {}, metrics, keep_last=2)
    newest = latest_checkpoint(tmp_path / "ck")
    assert newest.step == 75 and newest.loop_state() == {"sampler": {}, "step": 75}
    assert (newest.path / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert (tmp_path / "ck" / ".tmp-step_000100").exists()  # left behind by the kill, ignored ...
    save_checkpoint(tmp_path / "ck", 100, FakeTrainer(), {}, metrics, keep_last=2)
    assert not (tmp_path / "ck" / ".tmp-step_000100").exists()  # ... and replaced by the next save
    assert latest_checkpoint(tmp_path / "nothing") is None


def test_driver_rng_round_trip_through_json():
    random.seed(5)
    torch.manual_seed(5)
    state = json.loads(json.dumps(driver_rng_state()))
    expected = (random.random(), torch.rand(2).tolist())
    random.seed(0)
    torch.manual_seed(0)
    restore_driver_rng(state)
    assert (random.random(), torch.rand(2).tolist()) == expected


def test_run_dir_checks_fail_before_step_one(tmp_path, monkeypatch):
    recipe = load_recipe("tiny-cpu")
    assert checkpoint_bytes(recipe) == 2_210_000 * 14  # bf16 weights + fp32 masters + Adam moments
    assert checkpoint_bytes(load_recipe("amd-dsv4-flash-mi308x")) == 284_000_000_000 * 14
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ReproError, match=r"run dir .*file/run: cannot write there"):
        prepare_run_dir(recipe, blocker / "run", resume=False)
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9, 10_000_000))
    with pytest.raises(ReproError, match=r"0.01 GB free, checkpoints need about 0.09 GB \(2 kept \+ 1 being written"):
        prepare_run_dir(recipe, tmp_path / "run", resume=False)
    monkeypatch.undo()
    prepare_run_dir(recipe, tmp_path / "run", resume=False)
    assert (tmp_path / "run" / "recipe.yaml").exists()
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    with pytest.raises(ReproError, match="already holds a run .*pass --resume"):
        prepare_run_dir(recipe, tmp_path / "run", resume=False)
    prepare_run_dir(recipe, tmp_path / "run", resume=True)


RECORDED = json.loads((REPO_DIR / "tests/data/lumenrl/prompt_renderings.json").read_text())


@pytest.mark.parametrize("case", RECORDED["orders"], ids=lambda c: f"{c['rows']}rows")
def test_randperm_order_is_lumenrls(case):
    """LumenRL's own _build_prompt_permutation/_get_prompts_range (2232f55), recorded by
    benchmarks/lumenrl_prompt_equivalence.py: the same row indices step by step, the 50-row file wrapping mid-batch
    into the same permutation again."""
    sampler = PromptSampler(case["rows"], case["batch"], case["seed"], order="randperm")
    assert [sampler.next_batch() for _ in case["lumenrl_batches"]] == case["lumenrl_batches"]


def test_randperm_resumes_and_refuses_another_orders_state():
    sampler = PromptSampler(50, 32, seed=10086, order="randperm")
    first = sampler.next_batch()
    assert sampler.state() == {"order": "randperm", "cursor": 32, "seed": 10086, "num_problems": 50}
    resumed = PromptSampler(50, 32, seed=10086, order="randperm")
    resumed.load_state(sampler.state())
    assert resumed.next_batch() == sampler.next_batch() and first != resumed.next_batch()
    with pytest.raises(ValueError, match="sampler state is in data.train.order 'epochs', this run has 'randperm'"):
        PromptSampler(50, 32, seed=10086, order="randperm").load_state(PromptSampler(50, 32, seed=10086).state())
    with pytest.raises(ValueError, match="data.train.order must be one of"):
        PromptSampler(50, 32, seed=1, order="shuffled")


def test_the_amd_recipes_first_step_prompts_are_amds_on_the_same_file(tmp_path):
    """A file whose row order is known (row i asks 'row i'), as many rows as DAPO-Math-17K has problems: the AMD
    recipe's loader and sampler pick, for step 1, the 32 rows LumenRL's code picks over the same file."""
    case = next(c for c in RECORDED["orders"] if c["rows"] == 17_398)
    path = tmp_path / "dapo-math-17k.jsonl"
    with path.open("w") as out:
        for i in range(case["rows"]):
            out.write(json.dumps({"data_source": "math_dapo", "prompt": [{"role": "user", "content": f"row {i}"}],
                                  "reward_model": {"ground_truth": str(i)}, "extra_info": {"index": i}}) + "\n")
    recipe = load_recipe("amd-dsv4-flash-mi308x", [f"data.train.path={path}"])
    problems = load_dataset(recipe.data.train, tmp_path)
    sampler = PromptSampler.for_recipe(recipe, len(problems))
    first_step = [problems[i].problem for i in sampler.next_batch()]
    assert first_step == [f"row {i}" for i in case["lumenrl_batches"][0]]
