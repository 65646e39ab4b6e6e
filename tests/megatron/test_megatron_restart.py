"""A Megatron rank's death (the Megatron lane): rank 1 of a TP 2 trainer world, killed with SIGKILL by the pid the
run recorded while Ray shows it inside train_step at step 2. Rank 0 is left blocked in the collective; the run names
the dead rank and the step, ends both groups (rank 0 included), starts a new world and rollout, resumes from
checkpoint 1 and ends with the uninterrupted run's numbers. Every process of both attempts is gone afterwards."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed here: "
                                            "`make test-megatron` runs this lane in .venv-megatron")

import torch  # noqa: E402
from run_faults_support import log_rows, numbers, wait_gone  # noqa: E402

from repro.model.tiny_qwen3_moe import build_tiny_math_qwen3_moe  # noqa: E402
from repro.recipes import load_recipe  # noqa: E402
from repro.engines import run_recipe  # noqa: E402

STEPS = 3
RANK1 = "trainer worker 1 (rank 1)"


@pytest.fixture(scope="module")
def ray_instance():
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=3, num_gpus=0, include_dashboard=False, log_to_driver=False,
             object_store_memory=200 * 1024**2, namespace="repro")
    yield
    ray.shutdown()


def megatron_recipe(model_dir, *extra):
    return load_recipe("tiny-cpu", [
        "actor.dtype=fp32", "actor.backend=megatron", "actor.num_workers=2", "actor.tensor_parallel=2",
        "actor.sequence_parallel=true", "actor.model_provider=repro.train.megatron.qwen3:provider",
        f"model.path={model_dir}", "algorithm.prompts_per_step=4", "lengths.max_response=12",
        "eval.samples_per_problem=1", "eval.every_steps=2", "checkpoint.every_steps=1", *extra], steps=STEPS)


def test_a_dead_megatron_rank_restarts_the_world_and_the_run_ends_as_the_uninterrupted_one(
        tmp_path, ray_instance, monkeypatch):
    import psutil

    import repro.run.loop as loop

    model_dir = build_tiny_math_qwen3_moe(tmp_path / "model", seed=0)
    torch.set_num_threads(1)
    run_recipe(megatron_recipe(model_dir), tmp_path / "whole")

    real_update, killed = loop.update_policy, {}

    def update_killing_rank_1_at_step_2(run, clock, batch):
        if not killed and len([r for r in run.metrics.rows() if r["kind"] == "train"]) == 1:
            workers = json.loads((tmp_path / "run" / "logs" / "workers.json").read_text())["attempts"][-1]
            rank1 = psutil.Process(next(w["pid"] for w in workers if w["name"] == RANK1))

            def watch():
                deadline = time.time() + 120
                while time.time() < deadline:
                    if rank1.cmdline()[0] == "ray::TrainerWorker.train_step":
                        killed["title"] = rank1.cmdline()[0]
                        rank1.send_signal(signal.SIGKILL)
                        return
                    time.sleep(0.001)

            threading.Thread(target=watch, daemon=True).start()
        return real_update(run, clock, batch)

    monkeypatch.setattr(loop, "update_policy", update_killing_rank_1_at_step_2)
    said = []
    run_recipe(megatron_recipe(model_dir, "checkpoint.max_restarts=1"), tmp_path / "run", say=said.append)

    assert killed == {"title": "ray::TrainerWorker.train_step"}
    rows = log_rows(tmp_path / "run")
    restarts = [r for r in rows if r["kind"] == "restart"]
    assert [(r["step"], r["worker"], r["call"], r["resumed_from"]) for r in restarts] == [(2, RANK1, "train_step", 1)]
    assert restarts[0]["cause"].startswith(f"step 2: {RANK1} died during train_step: ")
    assert numbers(rows) == numbers(log_rows(tmp_path / "whole"))
    attempts = json.loads((tmp_path / "run" / "logs" / "workers.json").read_text())["attempts"]
    assert len(attempts) == 2 and [w["name"] for w in attempts[0]] == ["trainer worker 0 (rank 0)", RANK1,
                                                                        "rollout worker 0"]
    assert wait_gone([w for workers in attempts for w in workers]) == []
    print("\n" + "\n".join(said))  # what the user saw (pytest -s)
