"""The rollout-engine interface the RL loop talks to; the embedded CPU engine (``repro.rollout.embedded``) and
vLLM (``repro.rollout.vllm_engine``) implement it, and declare what they can do -- and which wire their weights
arrive by -- in ``repro.recipes.backends.ROLLOUTS``.

A weight sync reaches an engine bucket by bucket through ``begin_sync`` / ``apply_bucket`` / ``finish_sync``
(``repro.sync.apply``), from the trainer's stream in one process or repro's bucket wire on Ray
(``repro.sync.bucket_wire``); an engine whose serving library brings its own transfer, or whose workers receive
themselves, adds that to its own wire (vLLM: ``repro.rollout.vllm_transfer``). Between the first bucket and a
successful finish the ``gate`` refuses ``generate``.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

from repro.errors import ReproError
from repro.recipes.backends import RolloutCapabilities
from repro.rollout.types import RolloutResult, SamplingParams
from repro.sync.apply import SyncTarget


class RolloutError(ReproError):
    """A request or weight update the engine cannot serve."""


def check_prompts(prompts: list[list[int]], max_context: int, error: type[RolloutError] = RolloutError) -> None:
    """What every engine refuses before it generates, the same way: no prompts, an empty prompt (it needs at least a
    BOS token), a prompt that leaves no room for one new token in ``max_context`` (``lengths.max_context``)."""
    if not prompts:
        raise error("generate: no prompts")
    for index, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise error(f"generate: prompt {index} is empty (it needs at least a BOS token)")
        if len(prompt) >= max_context:
            raise error(f"generate: prompt {index} has {len(prompt)} tokens, the context holds {max_context} "
                        f"(lengths.max_context) with room for at least one new token")


class RolloutEngine(SyncTarget, Protocol):
    capabilities: ClassVar[RolloutCapabilities]
    weight_version: int

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutResult:
        """Sample ``params.n`` responses per prompt (token ids, BOS included); refused while the gate is closed."""
