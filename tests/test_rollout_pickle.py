"""A RolloutResult crosses process boundaries as stacked tensors and comes back equal, field by field."""

from __future__ import annotations

import pickle

import torch

from repro.rollout.types import FinishReason, RolloutResult, Trajectory, pack_trajectories


def trajectory(i: int, prompt_len: int, response_len: int, layers=(0, 2), lp_dtype=torch.float32) -> Trajectory:
    fed = prompt_len + response_len - 1
    return Trajectory(
        prompt_index=i // 2, sample_index=i % 2,
        prompt_ids=[100 + i + k for k in range(prompt_len)],
        response_ids=[7 * i + k for k in range(response_len)],
        logprobs=torch.arange(response_len, dtype=lp_dtype) * -0.25 - i,
        finish_reason=FinishReason.EOS if i % 3 else FinishReason.LENGTH,
        weight_version=5,
        routing={layer: torch.arange(fed * 2, dtype=torch.int64).reshape(fed, 2) + layer * 10 + i for layer in layers},
    )


def assert_same(a: list[Trajectory], b: list[Trajectory]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x.prompt_index, x.sample_index, x.prompt_ids, x.response_ids, x.finish_reason, x.weight_version) == \
               (y.prompt_index, y.sample_index, y.prompt_ids, y.response_ids, y.finish_reason, y.weight_version)
        assert type(y.prompt_ids[0]) is int and y.finish_reason is x.finish_reason
        assert x.logprobs.dtype == y.logprobs.dtype and torch.equal(x.logprobs, y.logprobs)
        assert sorted(x.routing) == sorted(y.routing)
        for layer in x.routing:
            assert x.routing[layer].dtype == y.routing[layer].dtype and torch.equal(x.routing[layer], y.routing[layer])


def test_round_trip_is_exact_and_stacked():
    trajs = [trajectory(i, prompt_len=3 + i % 2, response_len=1 + i) for i in range(6)]
    result = RolloutResult(trajs, generated_tokens=21, seconds=0.5)
    back = pickle.loads(pickle.dumps(result))
    assert (back.generated_tokens, back.seconds) == (21, 0.5)
    assert_same(trajs, back.trajectories)
    packed = pack_trajectories(trajs)
    # a fixed number of tensors, whatever the batch size: ids, tokens, log-probs, routing row counts, one per layer
    assert packed["tokens"].numel() == sum(t.num_tokens for t in trajs) == 3 * 3 + 3 * 4 + 21
    assert packed["logprobs"].shape == (21,) and set(packed["routing"]) == {0, 2}
    assert packed["routing"][2].shape == (sum(t.num_tokens - 1 for t in trajs), 2)


def test_no_routing_recorded_round_trips():
    trajs = [trajectory(i, 2, 3, layers=()) for i in range(4)]
    back = pickle.loads(pickle.dumps(RolloutResult(trajs, 12, 0.1)))
    assert_same(trajs, back.trajectories)
    assert all(t.routing == {} for t in back.trajectories)


def test_unstackable_trajectories_are_kept_as_objects():
    trajs = [trajectory(0, 2, 3), trajectory(1, 2, 3, lp_dtype=torch.float64), trajectory(2, 2, 2, layers=(0,))]
    assert "objects" in pack_trajectories(trajs)
    assert_same(trajs, pickle.loads(pickle.dumps(RolloutResult(trajs, 8, 0.1))).trajectories)
    assert pickle.loads(pickle.dumps(RolloutResult([], 0, 0.0))).trajectories == []
