"""Which prompts each step trains on, with a resumable position, in one of two orders (``data.train.order``):

``randperm``  LumenRL's (AMD's run): one ``torch.randperm(N, generator=torch.Generator().manual_seed(seed))`` over
              the N rows, read with a running cursor that wraps to the start of the same permutation, mid-batch if it
              comes to that (lumenrl/trainer/rl_trainer.py ``_build_prompt_permutation`` 1231-1259 and
              ``_get_prompts_range`` 1427-1442 at 2232f55, verl's first-epoch ``RandomSampler`` order). The CPU
              generator makes it a function of (N, seed) alone: on the same file, the same prompts as AMD's run.
``epochs``    repro's earlier order: a fresh permutation per epoch seeded by (seed, epoch) with Python's ``random``;
              a batch that would cross an epoch's end starts the next epoch instead.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe

ORDERS = ("randperm", "epochs")


class PromptSampler:
    """Yields ``batch`` problem indices per step; ``state()`` captures the position for resume."""

    def __init__(self, num_problems: int, batch: int, seed: int, order: str = "epochs"):
        if order not in ORDERS:
            raise ValueError(f"data.train.order must be one of {ORDERS}, got {order!r}")
        if num_problems < batch:
            raise ValueError(f"{num_problems} problems cannot fill a batch of {batch} prompts")
        self.num_problems, self.batch, self.seed, self.order = num_problems, batch, seed, order
        self.epoch, self.offset = 0, 0  # epochs
        self.cursor = 0                 # randperm
        self._permutation: list[int] | None = None

    @classmethod
    def for_recipe(cls, recipe: "Recipe", num_problems: int) -> "PromptSampler":
        """The sampler a run of ``recipe`` draws its ``num_problems`` training problems with."""
        return cls(num_problems, recipe.algorithm.prompts_per_step, recipe.seed, recipe.data.order)

    def _order(self, epoch: int) -> list[int]:
        order = list(range(self.num_problems))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def permutation(self) -> list[int]:
        """The ``randperm`` order over all rows (computed once)."""
        if self._permutation is None:
            generator = torch.Generator().manual_seed(self.seed)
            self._permutation = torch.randperm(self.num_problems, generator=generator).tolist()
        return self._permutation

    def next_batch(self) -> list[int]:
        """The next ``batch`` indices."""
        if self.order == "randperm":
            permutation = self.permutation()
            picked = [permutation[(self.cursor + i) % self.num_problems] for i in range(self.batch)]
            self.cursor += self.batch
            return picked
        if self.offset + self.batch > self.num_problems:
            self.epoch, self.offset = self.epoch + 1, 0
        picked = self._order(self.epoch)[self.offset : self.offset + self.batch]
        self.offset += self.batch
        return picked

    def state(self) -> dict:
        if self.order == "randperm":
            return {"order": "randperm", "cursor": self.cursor, "seed": self.seed, "num_problems": self.num_problems}
        return {"epoch": self.epoch, "offset": self.offset, "seed": self.seed, "num_problems": self.num_problems}

    def load_state(self, state: dict) -> None:
        saved_order = state.get("order", "epochs")  # states written before the field have the epochs order
        if saved_order != self.order:
            raise ValueError(f"sampler state is in data.train.order {saved_order!r}, this run has {self.order!r}")
        if (state["seed"], state["num_problems"]) != (self.seed, self.num_problems):
            raise ValueError(
                f"sampler state is for seed {state['seed']} over {state['num_problems']} problems, "
                f"this run has seed {self.seed} over {self.num_problems}"
            )
        if self.order == "randperm":
            self.cursor = state["cursor"]
        else:
            self.epoch, self.offset = state["epoch"], state["offset"]
