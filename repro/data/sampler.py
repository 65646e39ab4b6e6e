"""Which prompts each step trains on: seeded epochs without replacement, with a resumable position."""

from __future__ import annotations

import random


class PromptSampler:
    """Yields ``batch`` problem indices per step. Each epoch is a fresh permutation seeded by (seed, epoch),
    so the order depends only on the seed and the position, which ``state()`` captures for resume."""

    def __init__(self, num_problems: int, batch: int, seed: int):
        if num_problems < batch:
            raise ValueError(f"{num_problems} problems cannot fill a batch of {batch} prompts")
        self.num_problems, self.batch, self.seed = num_problems, batch, seed
        self.epoch, self.offset = 0, 0

    def _order(self, epoch: int) -> list[int]:
        order = list(range(self.num_problems))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def next_batch(self) -> list[int]:
        """The next ``batch`` indices; a batch that would cross an epoch's end starts the next epoch instead."""
        if self.offset + self.batch > self.num_problems:
            self.epoch, self.offset = self.epoch + 1, 0
        picked = self._order(self.epoch)[self.offset : self.offset + self.batch]
        self.offset += self.batch
        return picked

    def state(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset, "seed": self.seed, "num_problems": self.num_problems}

    def load_state(self, state: dict) -> None:
        if (state["seed"], state["num_problems"]) != (self.seed, self.num_problems):
            raise ValueError(
                f"sampler state is for seed {state['seed']} over {state['num_problems']} problems, "
                f"this run has seed {self.seed} over {self.num_problems}"
            )
        self.epoch, self.offset = state["epoch"], state["offset"]
