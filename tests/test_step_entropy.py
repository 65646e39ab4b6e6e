"""``actor/entropy`` as LumenRL logs it (rl_trainer.py ~4131-4139 at 2232f55): the token-weighted mean of pi_old's
entropy over the response tokens of every row of the step, zero-advantage rows included, whichever way the loop
gets pi_old. The trainer is a stand-in that returns hand-built entropies and records the batch it was given; it
does not cover the trainers' own entropy (the trainer contract tests do)."""

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
