"""The loop's rollout worker builds the vLLM engine for rollout.backend: vllm and takes weight-sync buckets."""

import torch

from repro.model.tiny_qwen3_moe import BOS_ID, checkpoint_tensors
from repro.rollout.types import SamplingParams
from repro.sync.errors import SyncError
from repro.sync.handoff import LocalStream
from repro.sync.stream import pack_buckets


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
        stats = worker.receive_weights(LocalStream(pack_buckets(weights.items(), bucket_bytes=256 * 1024, version=1)),
                                       version=1)
        assert stats.tensors == len(weights) and stats.buckets > 1 and worker.weight_version() == 1
        after = worker.generate([[BOS_ID, 3, 4]], params)
        assert not torch.equal(before.trajectories[0].logprobs[:1], after.trajectories[0].logprobs[:1])
        assert after.trajectories[0].weight_version == 1
    finally:
        worker.engine.close()


def test_vllm_workers_stream_over_the_sync_group_and_refuse_after_a_failed_sync(engine, model_dir):
    """The Ray path without Ray: a sender thread on a gloo sync group, vLLM's worker process joins it as rank 1
    and loads bucket by bucket; a corrupt bucket fails the sync, generate is refused until a full one succeeds."""
    import dataclasses
    import threading

    import pytest

    from repro.rollout.vllm_engine import VLLMRolloutError
    from repro.sync.group import free_address, SyncAddress, SyncGroup

    params = SamplingParams(n=2, max_new_tokens=4, seed=5)
    weights = checkpoint_tensors(model_dir)
    before = engine.generate([[BOS_ID, 3, 4]], params)
    address = SyncAddress(*free_address("127.0.0.1"), sender=0, receivers=1, timeout_s=120)
    sender = {}

    def send(version, damage=lambda bs: bs):
        group = sender.get("group") or sender.setdefault("group", SyncGroup(address, 0))
        group.send(damage(list(pack_buckets(weights.items(), 64 * 1024, version))))

    def corrupt(buckets):
        payload = buckets[1].payload.clone()
        payload[0] ^= 1
        return [buckets[0], dataclasses.replace(buckets[1], payload=payload), *buckets[2:]]

    thread = threading.Thread(target=send, args=(7, corrupt))
    thread.start()
    with pytest.raises(Exception, match="weight sync v7: bucket 1 of sender 0: payload fails its checksum"):
        engine.receive_from_groups([address], version=7)
    thread.join(120)
    with pytest.raises(VLLMRolloutError, match="generate refused: weight sync v7 failed"):
        engine.generate([[BOS_ID, 3, 4]], params)
    thread = threading.Thread(target=send, args=(8,))
    thread.start()
    stats = engine.receive_from_groups([address], version=8)
    thread.join(120)
    assert stats.tensors == len(weights) and stats.buckets > 1 and engine.weight_version == 8
    after = engine.generate([[BOS_ID, 3, 4]], params)
    assert [t.response_ids for t in after.trajectories] == [t.response_ids for t in before.trajectories]
    assert all(torch.equal(a.logprobs, b.logprobs) for a, b in zip(before.trajectories, after.trajectories))
