"""The rollout-engine interface the RL loop talks to; the embedded CPU engine and vLLM implement it."""

from __future__ import annotations

from typing import Iterable, Protocol

import torch

from repro.rollout.types import RolloutResult, SamplingParams


class RolloutEngine(Protocol):
    weight_version: int

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutResult:
        """Sample ``params.n`` responses per prompt (token ids, BOS included)."""

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Replace every weight with the trainer's (FP8 re-quantised if the engine serves FP8), all or nothing."""
