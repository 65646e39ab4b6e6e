"""The whole cluster path on one CPU box: `repro launch` places 2 Megatron trainer ranks (TP 2 with sequence
parallelism, one gloo world) and the embedded rollout on a local Ray instance, runs the loop on a tiny Qwen3-MoE
(megatron layout in the trainer, HF layout in the rollout, weights synced by name), checkpoints every rank and
resumes. Plus the pieces that make it consistent: the HF <-> megatron mapping and the rollout's recorded routing."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed here: "
                                            "`make test-megatron` runs this lane in .venv-megatron")

import torch  # noqa: E402

from repro.model.hf_folder import load_tiny_model  # noqa: E402
from repro.recipes import load_recipe  # noqa: E402
from repro.model.tiny_qwen3_moe import build_tiny_math_qwen3_moe  # noqa: E402
from repro.train.megatron.model import forward_logits, record_routing  # noqa: E402
from repro.train.megatron.trainer import MegatronTrainer  # noqa: E402
from test_megatron_contract import one_thread  # noqa: E402,F401


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return build_tiny_math_qwen3_moe(tmp_path_factory.mktemp("qwen3") / "model", seed=0)


def megatron_recipe(model_dir, *extra):
    return load_recipe("tiny-cpu", ["actor.dtype=fp32", "actor.backend=megatron",
                                    "actor.model_provider=repro.train.megatron.qwen3:provider",
                                    f"model.path={model_dir}", *extra])


def test_megatron_build_of_the_hf_checkpoint_computes_the_same_logits_and_exports_it_back(qwen3_dir, one_thread):
    hf = load_tiny_model(qwen3_dir)
    trainer = MegatronTrainer.from_recipe(megatron_recipe(qwen3_dir))
    ids = torch.randint(3, 25, (3, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (hf(input_ids=ids).logits - forward_logits(trainer.model, ids)).abs().max()
    assert float(diff) < 1e-5
    exported = dict(trainer.named_weights())
    assert exported.keys() == hf.state_dict().keys()
    assert all(torch.equal(exported[k], v) for k, v in hf.state_dict().items())


def test_rollout_records_the_experts_megatron_routes_to(qwen3_dir, one_thread):
    from repro.model.routing import RoutingRecorder

    hf = load_tiny_model(qwen3_dir)
    trainer = MegatronTrainer.from_recipe(megatron_recipe(qwen3_dir))
    ids = torch.randint(3, 25, (4, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), RoutingRecorder(hf) as recorder:
        hf(input_ids=ids)
    _, megatron = record_routing(trainer.model, ids)
    for layer, table in recorder.indices().items():
        assert table.shape == (4, 9, 2)
        assert torch.equal(table.sort(dim=-1).values, megatron[layer].sort(dim=-1).values)


def _launch(run_dir, model_dir, steps, *extra):
    from repro.cli import main

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    sets = ["actor.dtype=fp32", "actor.backend=megatron", "actor.num_workers=2", "actor.tensor_parallel=2",
            "actor.sequence_parallel=true",
            "actor.model_provider=repro.train.megatron.qwen3:provider", f"model.path={model_dir}",
            "eval.at_start=false", "eval.samples_per_problem=1", "checkpoint.every_steps=1",
            # the check below is the trainer/rollout numerics' agreement: both at the sampling temperature (tiny-cpu's
            # raw log-probs, AMD's convention, would add the T = 0.8 vs 1 gap to it)
            "rollout.logprobs_mode=processed"]
    args = ["launch", "--recipe", "tiny-cpu", "--steps", str(steps), "--run-dir", str(run_dir), "--quiet", *extra]
    for item in sets:
        args += ["--set", item]
    assert main(args) in (0, None)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_launch_runs_two_megatron_ranks_with_the_rollout_and_resumes(tmp_path, qwen3_dir):
    run_dir = tmp_path / "run"
    rows = _launch(run_dir, qwen3_dir, 1)
    placement = (run_dir / "logs" / "placement.txt").read_text()
    assert placement.count("trainer ") == 2 and placement.count("rollout ") == 1
    step = rows[0]
    assert step["step"] == 1 and step["weight_sync/version"] == 1
    # the rollout (FP8 view of the HF model) and the megatron ranks (fp32, TP 2, experts replayed) agree
    assert abs(step["rollout_corr/k3_kl"]) < 1e-3 and step["rollout_corr/rollout_is_eff_sample_size"] > 0.99
    # both ranks wrote one dist checkpoint (megatron's dist_checkpointing), sealed with the run's checkpoint
    trainer_dir = run_dir / "checkpoints" / "step_000001" / "trainer"
    assert sorted(p.name for p in trainer_dir.iterdir()) == ["dist", "trainer_state.json"]
    assert json.loads((trainer_dir / "trainer_state.json").read_text())["layout"]["tensor_model_parallel_size"] == 2

    rows = _launch(run_dir, qwen3_dir, 2, "--resume")
    steps = [r for r in rows if "weight_sync/version" in r]
    assert [r["step"] for r in steps] == [1, 2] and steps[-1]["weight_sync/version"] == 2
    assert abs(steps[-1]["rollout_corr/k3_kl"]) < 1e-3
