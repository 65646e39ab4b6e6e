"""Several Megatron trainer ranks on a real local Ray instance, joined into one gloo world by repro.groups.ray_ranks:
split TP 2, EP 2, PP 2 (1F1B with full recompute) or DP 2, the trainer scores, updates and exports exactly what
the same model does in one process -- the split is invisible in every number but float rounding."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed here: "
                                            "`make test-megatron` runs this lane in .venv-megatron")

import torch  # noqa: E402

from repro.recipes import load_recipe  # noqa: E402
from repro.train.megatron.trainer import MegatronTrainer  # noqa: E402
from test_megatron_contract import make_megatron_batch, one_thread  # noqa: E402,F401

LAYOUTS = {
    "tp2_sp": ["actor.tensor_parallel=2", "actor.sequence_parallel=true"],
    "ep2": ["actor.expert_parallel=2"],
    "pp2_recompute": ["actor.pipeline_parallel=2", "actor.recompute=full"],
    "dp2": [],
}
BASE = ["actor.dtype=fp32", "actor.backend=megatron", "actor.model_provider=repro.train.megatron.tiny:provider",
        "actor.max_tokens_per_micro_batch=40", "optim.lr=0.001", "optim.grad_clip=0.05", "seed=3"]


def recipe_for(extra: list[str], workers: int):
    return load_recipe("tiny-cpu", BASE + [f"actor.num_workers={workers}"] + extra)


@pytest.fixture(scope="module")
def ray_instance():
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=3, num_gpus=0, include_dashboard=False, log_to_driver=False,
             object_store_memory=200 * 1024**2)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def reference():
    """One process: log-probs, one update's metrics, the weights after it and the log-probs after it."""
    torch.set_num_threads(1)
    recipe = recipe_for(LAYOUTS["pp2_recompute"][1:], 1)
    trainer = MegatronTrainer.from_recipe(recipe)
    batch = make_megatron_batch(trainer.model, seed=5)
    before = trainer.logprobs(batch).logprobs
    batch.old_logprobs = before.clone()
    metrics = trainer.train_step(batch)
    weights = dict(trainer.named_weights())
    return batch, before, metrics, weights, trainer.logprobs(batch).logprobs


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_two_ranks_compute_what_one_process_computes(layout, ray_instance, reference):
    from repro.cluster.placement import TRAINER, create_placement_groups, plan_placement
    import ray

    from repro.groups.ray_groups import start_trainer_ranks
    from repro.sync.stream import verified_stream
    from repro.sync.group import receive_all, SyncGroup

    batch, before, metrics, weights, after = reference
    recipe = recipe_for(LAYOUTS[layout], 2)
    placed = create_placement_groups(plan_placement(recipe), timeout_s=60)
    try:
        group = start_trainer_ranks(placed, recipe, "", per_node=2, env={"OMP_NUM_THREADS": "1"})
        group.timeout_s = 300
        lp = group.logprobs(batch, True)
        torch.testing.assert_close(lp.logprobs, before, atol=2e-5, rtol=0)
        batch.old_logprobs = before.clone()
        got = group.train_step(batch)
        for key in ("actor/loss", "actor/grad_norm", "actor/entropy_nonzero_adv", "actor/pg_clipfrac", "actor/ppo_kl"):
            assert got[key] == pytest.approx(metrics[key], rel=1e-4, abs=1e-6), key
        assert got["actor/grad_norm"] > 0.05  # the clip acted: the global norm, not a rank's, set its scale
        sent = group.send_weights(1)
        stages = recipe.actor.pipeline_parallel  # each stage's first rank sends its layers; the others gather
        assert [a.sender for a in sent.source.addresses] == list(range(stages))
        receivers = [SyncGroup(a, rank=1) for a in sent.source.addresses]  # this test process is the rollout side
        synced = {name: t.clone() for _, named in verified_stream(receive_all(receivers, 1), 1, stages)
                  for name, t in named}
        sent_bytes = ray.get(sent.calls, timeout=300)
        assert sent_bytes[0] > 0 and (sent_bytes[1] > 0) == (stages == 2)
        assert sorted(synced) == sorted(weights)  # every full weight exactly once, full names
        for name, tensor in weights.items():
            torch.testing.assert_close(synced[name], tensor, atol=2e-6, rtol=0, msg=name)
        torch.testing.assert_close(group.logprobs(batch, True).logprobs, after, atol=2e-5, rtol=0)
    finally:
        placed.remove()
