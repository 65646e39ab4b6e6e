"""Two of the loop's steps as LumenRL (2232f55) takes them. ``actor/entropy`` (rl_trainer.py ~4131-4139): the
token-weighted mean of pi_old's entropy over the response tokens of every row of the step, zero-advantage rows
included, whichever way the loop gets pi_old. ``rollout.requests: per_sample``: each prompt sent once per response.
The trainer and the rollout are STAND-INS returning hand-built entropies and trajectories and recording what they
were given; they do not cover the real trainers' entropy or the engines' sampling (the trainer contract and the
loop tests do)."""

from __future__ import annotations

import pytest
import torch

from repro.recipes import load_recipe
from repro.run.steps import StepClock, update_policy
from repro.train.base import LogprobResult
from repro.train.batch import TrainBatch

MASK = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
ENTROPY = torch.tensor([[7.0, 1.0, 2.0, 7.0], [7.0, 7.0, 3.0, 7.0], [4.0, 4.0, 4.0, 4.0]])
LOGPROBS = -ENTROPY / 10


class StubTrainer:
    """Returns ENTROPY / LOGPROBS as pi_old and the trainer-side metrics a real trainer would."""

    def __init__(self):
        self.trained_on: TrainBatch | None = None

    def logprobs(self, batch, replay_routing):
        return LogprobResult(LOGPROBS.clone(), ENTROPY.clone())

    def train_step(self, batch):
        self.trained_on = batch
        return {"actor/entropy_nonzero_adv": 2.5}

    def scored_train_step(self, batch):
        self.trained_on = batch
        return LogprobResult(LOGPROBS.clone(), ENTROPY.clone()), {"actor/entropy_nonzero_adv": 2.5}


class StubRun:
    def __init__(self, recipe):
        self.recipe, self.trainer = recipe, StubTrainer()


def batch() -> TrainBatch:
    rows, width = MASK.shape
    zeros = torch.zeros(rows, width)
    return TrainBatch(input_ids=torch.zeros(rows, width, dtype=torch.int64), targets=torch.zeros(rows, width,
                      dtype=torch.int64), response_mask=MASK, advantages=torch.tensor([0.5, -0.5, 0.0]),
                      rollout_logprobs=zeros, old_logprobs=None, routing=None)


@pytest.mark.parametrize("from_update", [True, False])
def test_actor_entropy_is_over_every_response_token(from_update):
    recipe = load_recipe("tiny-cpu", [f"actor.old_logprobs_from_update={str(from_update).lower()}"])
    run = StubRun(recipe)
    updated = update_policy(run, StepClock(), batch())
    # (1 + 2) + 3 + 4 * 4 over 2 + 1 + 4 tokens; the zero-advantage row 2 is in it
    assert updated.metrics["actor/entropy"] == pytest.approx(22 / 7, abs=1e-12)
    assert updated.metrics["actor/entropy_nonzero_adv"] == 2.5  # the trainer's own figure, under its own name
    assert torch.equal(updated.batch.old_logprobs, LOGPROBS)
    if not from_update:
        assert torch.equal(run.trainer.trained_on.old_logprobs, LOGPROBS)  # the update saw the separate pass's pi_old


class StubRollout:
    """Records what it is asked and answers each prompt's n samples with the prompt's first token repeated."""

    def __init__(self):
        self.calls = []

    def generate(self, prompts, params):
        from repro.rollout.types import FinishReason, RolloutResult, Trajectory

        self.calls.append(([list(p) for p in prompts], params.n))
        trajectories = [Trajectory(i, k, list(p), [p[0], k], torch.zeros(2), FinishReason.EOS, 0)
                        for i, p in enumerate(prompts) for k in range(params.n)]
        return RolloutResult(trajectories, 2 * len(trajectories), 1.0)


@pytest.mark.parametrize("requests", ["per_sample", "per_prompt"])
def test_requests_per_sample_send_each_prompt_n_times_and_regroup(requests):
    """LumenRL's rollout sends each prompt once per response, n=1 (rl_trainer.py:614-627): the engine sees 3 x 4
    prompts, and the responses come back numbered in their prompt's group, prompt-major, as one n=4 request's."""
    from repro.rollout.types import SamplingParams
    from repro.run.steps import request_responses

    run = StubRun(load_recipe("tiny-cpu", [f"rollout.requests={requests}"]))
    run.rollout = StubRollout()
    result = request_responses(run, [[5, 6], [7], [8, 9, 9]], SamplingParams(n=4, max_new_tokens=3))
    asked, n = run.rollout.calls[0]
    if requests == "per_sample":
        assert n == 1 and asked == [[5, 6]] * 4 + [[7]] * 4 + [[8, 9, 9]] * 4
        assert [t.response_ids for t in result.trajectories] == [[p, 0] for p in (5, 5, 5, 5, 7, 7, 7, 7, 8, 8, 8, 8)]
    else:
        assert n == 4 and asked == [[5, 6], [7], [8, 9, 9]]
    assert [(t.prompt_index, t.sample_index) for t in result.trajectories] == \
        [(i, k) for i in range(3) for k in range(4)]
    assert [t.prompt_ids for t in result.trajectories][::4] == [[5, 6], [7], [8, 9, 9]]
    assert result.generated_tokens == 24
