"""The tracking sinks on a real tiny run (in-process groups, small batches) that crashes twice and is resumed:
TensorBoard's events, read back with TensorBoard's own reader, equal metrics.jsonl value for value; W&B's offline
files, read back with W&B's own reader of them (`wandb leet inspect --json`, W&B's CLI for its .wandb
transaction log), hold every step once, with the resolved recipe as the run's config; every step's rollouts file
agrees with its metrics row. And a sink that cannot start stops the run before any worker starts, naming the field.

W&B runs offline here (no network, no login): the recipe's default mode.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from repro.errors import ReproError
from repro.recipes import load_recipe
from repro.run.loop import train
from repro.run.metrics_log import MetricsLog
from repro.run.rollouts_file import read_rollouts, rollouts_path
from repro.run.run_dir import check_inputs, open_run
from repro.engines import run_recipe
from repro.run.start import in_process_groups

SMALL = [
    "steps=4", "algorithm.prompts_per_step=4", "lengths.max_response=12", "eval.samples_per_problem=2",
    "eval.at_start=false", "eval.after_first_update=false", "eval.every_steps=3", "checkpoint.every_steps=2",
    "checkpoint.keep_last=3", "tracking.tensorboard=true", "tracking.wandb.enabled=true",
]
WALL_CLOCK = ("timing_s/", "perf/rollout_tokens_per_s", "weight_sync/gbps", "weight_sync/seconds")


class Crash(RuntimeError):
    pass


def crash_after_logging(step):
    def progress(logged, row):
        if logged == step:
            raise Crash(f"stopped after logging step {step}")
    return progress


def attempt(recipe, run_dir, groups, resume, progress):
    """What run_recipe does with one attempt, on groups kept across attempts (one start-up for the test)."""
    check_inputs(recipe, run_dir, resume)
    run = open_run(recipe, run_dir, *groups, resume=resume)
    run.progress = progress
    try:
        train(run)
    except Crash:
        run.metrics.close(exit_code=1)
        return run
    run.metrics.close()
    return run


def wandb_records(run_dir):
    """Every record of every W&B attempt of the run, in the order of its folders, through W&B's own reader."""
    records = []
    for folder in sorted((run_dir / "wandb").glob("offline-run-*")):
        done = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(folder)],
                              capture_output=True, text=True, check=True)
        records.append([json.loads(line) for line in done.stdout.splitlines()])
    return records


def scalar_items(row):
    return {k: v for k, v in row.items() if k not in ("step", "kind") and isinstance(v, (int, float))
            and not isinstance(v, bool)}


@pytest.fixture(scope="module")
def crashed_twice(tmp_path_factory, one_thread):
    """Attempt 1 stops after logging step 4 (before checkpoint 4), and W&B loses what it had not yet written to
    disk (a SIGKILL leaves its transaction log as the 7-byte header: measured); attempt 2 resumes from 2 and stops
    after logging step 4 again; attempt 3 resumes from 2 and finishes. Step 3 is followed by an evaluation."""
    recipe = load_recipe("tiny-cpu", SMALL)
    run_dir = tmp_path_factory.mktemp("tracked")
    groups = in_process_groups(recipe, check_inputs(recipe, run_dir, False))
    attempt(recipe, run_dir, groups, False, crash_after_logging(4))
    (log,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    log.write_bytes(log.read_bytes()[:7])
    second = attempt(recipe, run_dir, groups, True, crash_after_logging(4))
    assert second.start_step == 2
    third = attempt(recipe, run_dir, groups, True, lambda step, row: None)
    assert third.start_step == 2
    return recipe, run_dir


@pytest.mark.slow
def test_tensorboard_reads_back_metrics_jsonl_value_for_value(crashed_twice):
    # the reader TensorBoard's own server loads runs with (the older event_accumulator keeps tensors apart and does
    # not purge them on a restart)
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    recipe, run_dir = crashed_twice
    accumulator = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0})
    accumulator.Reload()
    read = {}
    for tag in accumulator.Tags()["tensors"]:
        for event in accumulator.Tensors(tag):
            assert (tag, event.step) not in read, (tag, event.step)  # each step once, after two purges
            read[(tag, event.step)] = tensor_util.make_ndarray(event.tensor_proto).item()
        assert accumulator.SummaryMetadata(tag).plugin_data.plugin_name == "scalars"  # TensorBoard's scalar charts
    expected = {(k, row["step"]): v for row in MetricsLog(run_dir / "metrics.jsonl").rows()
                for k, v in scalar_items(row).items()}
    assert read == expected  # exactly: float64 events, the recomputed steps' own wall-clock values included
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 3  # one per attempt


@pytest.mark.slow
def test_wandb_offline_files_hold_every_step_once_and_the_recipe_as_config(crashed_twice):
    recipe, run_dir = crashed_twice
    attempts = wandb_records(run_dir)
    assert len(attempts) == 3 and attempts[0] == []  # the first attempt's file as a kill leaves it
    run_id = (run_dir / "wandb" / "run_id").read_text().strip()
    history = [[]]
    for records in attempts[1:]:
        (run,) = [r["run"] for r in records if r["type"] == "run"]
        assert run["run_id"] == run_id and run["project"] == "repro"
        config = {k: v for k, v in run["config"]["update"].items() if k != "_wandb"}
        assert config == recipe.model_dump(mode="json")
        history.append([r["history"] for r in records if r["type"] == "history"])
    steps = [[h["step"].get("num", 0) for h in attempt] for attempt in history]
    # attempt 1's file lost everything; attempt 2 sent the log's steps 1-2 from metrics.jsonl, then 3 live (its
    # step 4 failed: dropped); attempt 3 found 1-3 in W&B's files and sent 4
    assert steps == [[], [1, 2, 3], [4]]
    rows = MetricsLog(run_dir / "metrics.jsonl").rows()
    logged = {h["step"].get("num", 0): h["item"] for attempt in history for h in attempt}
    for step in range(1, 5):
        want = {k: v for row in rows if row["step"] == step for k, v in scalar_items(row).items()}
        got = {k: v for k, v in logged[step].items() if not k.startswith("_")}
        if step == 3:  # sent by attempt 2, recomputed by attempt 3: the same numbers but for wall-clock ones
            want = {k: v for k, v in want.items() if not k.startswith(WALL_CLOCK)}
            got = {k: v for k, v in got.items() if not k.startswith(WALL_CLOCK)}
        assert got == want, step
    assert "eval/avg@2" in logged[3] and "eval/avg@2" in logged[4]  # the evaluation is in its step's row


@pytest.mark.slow
def test_every_step_has_its_rollouts_and_they_agree_with_the_metrics_row(crashed_twice):
    recipe, run_dir = crashed_twice
    rows = {r["step"]: r for r in MetricsLog(run_dir / "metrics.jsonl").rows() if r["kind"] == "train"}
    for step, row in rows.items():
        records = read_rollouts(rollouts_path(run_dir, step))
        assert len(records) == recipe.trajectories_per_step
        tokens = sum(r["length"] for r in records)
        assert tokens / len(records) == pytest.approx(row["response_length/mean"], rel=1e-12)
        assert sum(r["acc"] for r in records) / len(records) == pytest.approx(row["reward/accuracy"], rel=1e-12)
        k1 = sum(r["rollout_logprob_sum"] - r["trainer_logprob_sum"] for r in records) / tokens
        assert k1 == pytest.approx(row["rollout_corr/kl"], rel=1e-9)
        assert sum(r["k3_kl"] * r["length"] for r in records) / tokens == pytest.approx(row["rollout_corr/k3_kl"],
                                                                                        rel=1e-9)
        high = sum(r["above_cap_share"] * r["length"] for r in records) / tokens
        assert high == pytest.approx(row["rollout_corr/rollout_is_ratio_fraction_high"], abs=1e-12)
        assert Counter(r["group"] for r in records) == Counter({g: 8 for g in range(4)})
        assert "timing_s/rollouts_file" in row


def test_a_sink_that_cannot_start_stops_the_run_before_any_worker(tmp_path, monkeypatch):
    import repro.run.start as start

    def no_workers(*args, **kwargs):
        raise AssertionError("a worker was started")

    monkeypatch.setattr(start, "in_process_groups", no_workers)
    recipe = load_recipe("tiny-cpu", ["tracking.wandb.enabled=true"])
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "wandb", None)  # as if not installed
        with pytest.raises(ReproError, match=r"^tracking.wandb.enabled: wandb cannot be imported .*repro\[wandb\]"):
            run_recipe(recipe, tmp_path / "a", in_process=True, say=lambda line: None)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "tensorboard").write_text("a file where the folder goes")
    recipe = load_recipe("tiny-cpu", ["tracking.tensorboard=true"])
    with pytest.raises(ReproError, match=r"^tracking.tensorboard: cannot write .*b/tensorboard"):
        run_recipe(recipe, tmp_path / "b", in_process=True, say=lambda line: None)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "rollouts").write_text("")
    with pytest.raises(ReproError, match=r"^tracking.rollouts: cannot write .*c/rollouts"):
        run_recipe(load_recipe("tiny-cpu"), tmp_path / "c", in_process=True, say=lambda line: None)
