"""AMD's stack in miniature on one CPU box: `repro launch` with 2 Megatron-core trainer ranks (TP 2 + sequence
parallel, one gloo world) and the vLLM rollout, placed on a local Ray instance, on a tiny Qwen3-MoE. The trainer
exports checkpoint-format names, vLLM reloads them in place after every step, routing recorded by vLLM's
routers is replayed in megatron's, and trainer and rollout agree."""

from __future__ import annotations

import json
import os

import pytest


def test_launch_runs_megatron_ranks_with_the_vllm_rollout(tmp_path):
    pytest.importorskip("megatron.core", reason="megatron-core is not installed in this venv "
                                                "(`make test-vllm` adds it)")
    from repro.cli import main
    from repro.model.tiny_qwen3_moe import build_tiny_math_qwen3_moe

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    model_dir = build_tiny_math_qwen3_moe(tmp_path / "model", seed=0)
    run_dir = tmp_path / "run"
    sets = ["actor.dtype=fp32", "actor.backend=megatron", "actor.num_workers=2", "actor.tensor_parallel=2",
            "actor.sequence_parallel=true",
            "actor.model_provider=repro.train.megatron.qwen3:provider", f"model.path={model_dir}",
            "rollout.backend=vllm", "eval.at_start=false", "eval.samples_per_problem=1",
            # the check below is the trainer/rollout numerics' agreement: both at the sampling temperature (tiny-cpu's
            # raw log-probs, AMD's convention, would add the T = 0.8 vs 1 gap to it)
            "rollout.logprobs_mode=processed"]
    args = ["launch", "--recipe", "tiny-cpu", "--steps", "2", "--run-dir", str(run_dir), "--quiet"]
    for item in sets:
        args += ["--set", item]
    assert main(args) in (0, None)
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in steps if "weight_sync/version" in row]
    assert [row["weight_sync/version"] for row in steps] == [1, 2]
    for row in steps:  # step 2 samples from the weights synced after step 1
        assert abs(row["rollout_corr/k3_kl"]) < 1e-3 and row["rollout_corr/rollout_is_eff_sample_size"] > 0.99
    placement = (run_dir / "logs" / "placement.txt").read_text()
    assert placement.count("trainer ") == 2 and placement.count("rollout ") == 1
