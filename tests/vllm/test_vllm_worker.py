"""The loop's rollout worker builds the vLLM engine for rollout.backend: vllm and takes weight-sync buckets."""

import torch

from repro.model.tiny_qwen3_moe import BOS_ID, checkpoint_tensors
from repro.rollout.types import SamplingParams
from repro.sync import make_buckets


def test_rollout_worker_serves_vllm_and_applies_buckets(model_dir, recipe):
    from repro.rollout.vllm_engine import VLLMEngine
    from repro.groups.workers import RolloutWorker

    worker = RolloutWorker(recipe.model_dump(), model_dir)  # a resolved-recipe dict, as Ray actors get it
    try:
        assert isinstance(worker.engine, VLLMEngine) and worker.weight_version() == 0
        params = SamplingParams(n=2, max_new_tokens=4, seed=5)
        before = worker.generate([[BOS_ID, 3, 4]], params)
        weights = checkpoint_tensors(model_dir)
        weights["model.norm.weight"] = weights["model.norm.weight"] * 3  # a different policy
        stats = worker.receive_weights(make_buckets(weights.items(), bucket_bytes=256 * 1024, version=1), version=1)
        assert stats.tensors == len(weights) and stats.buckets > 1 and worker.weight_version() == 1
        after = worker.generate([[BOS_ID, 3, 4]], params)
        assert not torch.equal(before.trajectories[0].logprobs[:1], after.trajectories[0].logprobs[:1])
        assert after.trajectories[0].weight_version == 1
    finally:
        worker.engine.close()
