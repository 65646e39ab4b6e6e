"""The loop end to end (in-process groups, small batches): logs, checkpoints, and resume equivalence.

What is bit-identical after a resume: every logged number except wall-clock ones (timing_s/*, perf/*,
weight_sync/gbps|seconds). The trainer's weights, Adam moments, step counters and RNG are restored exactly;
the rollout gets the trainer's weights re-quantised to FP8 by the same function; sampling seeds are a
function of (seed, step); the prompt sampler's position is restored. So a resumed run recomputes the very
same floats, on the same machine and thread count. (Across machines or thread counts, float reductions
may differ in the last bits.)
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from repro.run.loop import train
from repro.run.metrics_log import MetricsLog
from repro.recipes import load_recipe
from repro.run.run_dir import check_inputs, open_run
from repro.run.start import in_process_groups


def open_in_process(recipe, run_dir, resume=False):
    """What run_recipe does in this process, stopping short of train(): the test drives the loop itself."""
    model_dir = check_inputs(recipe, run_dir, resume)
    return open_run(recipe, run_dir, *in_process_groups(recipe, model_dir), resume=resume)

SMALL = [
    "steps=4", "algorithm.prompts_per_step=8", "eval.every_steps=2", "checkpoint.every_steps=2",
    "checkpoint.keep_last=3", "lengths.max_response=12", "eval.samples_per_problem=2",
    "data.order=randperm", "rollout.requests=per_sample",  # AMD's (LumenRL's) order and requests, resumed too
]
SEQUENCE_IS_KEYS = [f"rollout_corr/rollout_is_seq_{k}" for k in
                    ("mean", "std", "max", "min", "max_deviation", "fraction_high", "fraction_low")]
WALL_CLOCK = ("timing_s/", "perf/rollout_tokens_per_s", "weight_sync/gbps", "weight_sync/seconds")


def numbers(rows):
    return [{k: v for k, v in r.items() if not k.startswith(WALL_CLOCK)} for r in rows]


class Crash(RuntimeError):
    pass


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run = open_in_process(load_recipe("tiny-cpu", SMALL), tmp_path_factory.mktemp("a"))
    train(run)
    return run


def test_uninterrupted_run_logs_every_step_and_eval(uninterrupted):
    rows = uninterrupted.metrics.rows()
    # eval at 0 (tiny-cpu's at_start), after step 1 (LumenRL's EvalCallback, as AMD's run), then every 2 steps
    assert [(r["kind"], r["step"]) for r in rows] == [
        ("eval", 0), ("train", 1), ("eval", 1), ("train", 2), ("eval", 2), ("train", 3), ("train", 4), ("eval", 4)]
    train_row = rows[1]
    for key in ("reward/accuracy", "critic/score/mean", "rollout_corr/kl", "rollout_corr/k3_kl",
                "rollout_corr/rollout_is_eff_sample_size", "actor/loss", "actor/grad_norm", "actor/entropy",
                "actor/pg_clipfrac", "response_length/mean", "response_length/max", "response_length/clip_ratio",
                "perf/rollout_tokens_per_s", "weight_sync/gbps", "timing_s/rollout", "timing_s/reward",
                "timing_s/update", "timing_s/sync", "timing_s/step", "actor/entropy_nonzero_adv", *SEQUENCE_IS_KEYS):
        assert key in train_row, key
    seq = {k.rsplit("_seq_", 1)[1]: train_row[k] for k in SEQUENCE_IS_KEYS}
    print("\nstep 1:", {k: round(v, 6) for k, v in seq.items()}, "actor/entropy", round(train_row["actor/entropy"], 6),
          "actor/entropy_nonzero_adv", round(train_row["actor/entropy_nonzero_adv"], 6))
    assert seq["min"] <= seq["mean"] <= seq["max"] <= 2.0 and 0 <= seq["fraction_high"] <= 1
    assert seq["max_deviation"] == pytest.approx(max(seq["max"] - 1, 1 - seq["min"]))
    assert "timing_s/old_logprob" not in train_row  # pi_old came from the update's own forward (one update/step)
    assert train_row["critic/score/mean"] == pytest.approx(2 * train_row["reward/accuracy"] - 1)
    assert rows[0]["eval/num_problems"] == 30 and len(rows[0]["eval/correct_counts"]) == 30
    assert rows[0]["eval/avg@2"] == sum(rows[0]["eval/correct_counts"]) / 60
    assert [r["weight_sync/version"] for r in rows if r["kind"] == "train"] == [1, 2, 3, 4]
    assert sorted(p.name for p in uninterrupted.checkpoint_dir.iterdir()) == ["step_000002", "step_000004"]
    assert (uninterrupted.run_dir / "eval" / "step_000004.json").exists()


def test_resume_after_a_crash_mid_step_matches_the_uninterrupted_run(uninterrupted, tmp_path, monkeypatch):
    recipe = load_recipe("tiny-cpu", SMALL)
    run = open_in_process(recipe, tmp_path)
    import repro.run.loop as loop

    real_sync = loop.sync_weights

    def crash_at_step_3(trainer, rollout, version):
        if version == 3:
            raise Crash("killed after the update of step 3, before its sync and log")
        return real_sync(trainer, rollout, version)

    monkeypatch.setattr(loop, "sync_weights", crash_at_step_3)
    with pytest.raises(Crash):
        train(run)
    monkeypatch.setattr(loop, "sync_weights", real_sync)
    resumed = open_in_process(recipe, tmp_path, resume=True)
    assert resumed.start_step == 2
    train(resumed)
    rows = MetricsLog(tmp_path / "metrics.jsonl").rows()
    assert [(r["kind"], r["step"]) for r in rows] == [(r["kind"], r["step"]) for r in uninterrupted.metrics.rows()]
    assert numbers(rows) == numbers(uninterrupted.metrics.rows())


def test_sigkill_mid_run_then_resume_loses_and_repeats_no_step(tmp_path):
    """A real SIGKILL of the CLI process while it is inside step 3, then `repro run --resume`."""
    args = [sys.executable, "-m", "repro", "run", "--in-process", "--quiet", "--run-dir", str(tmp_path)]
    for override in SMALL:
        args += ["--set", override]
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    log = MetricsLog(tmp_path / "metrics.jsonl")
    deadline = time.time() + 300
    while time.time() < deadline and not any(r["step"] == 2 and r["kind"] == "eval" for r in log.rows()):
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        time.sleep(0.2)
    time.sleep(0.5)  # now inside step 3 (or writing checkpoint 2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = subprocess.run(args + ["--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    steps = [(r["kind"], r["step"]) for r in log.rows()]
    assert steps == [("eval", 0), ("train", 1), ("eval", 1), ("train", 2), ("eval", 2), ("train", 3), ("train", 4),
                     ("eval", 4)]
