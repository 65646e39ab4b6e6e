"""What a rollout engine returns: one record per sampled response, whichever backend produced it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch


class FinishReason(str, enum.Enum):
    EOS = "eos"        # the model ended the response itself
    LENGTH = "length"  # cut at max_new_tokens: a truncated response


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``n`` responses per prompt; ``seed`` makes a call reproducible."""

    n: int = 8
    temperature: float = 0.8
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 16
    seed: int = 0

    def __post_init__(self):
        if self.n < 1 or self.max_new_tokens < 1:
            raise ValueError(f"n and max_new_tokens must be >= 1, got n={self.n}, max_new_tokens={self.max_new_tokens}")
        if self.temperature <= 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"temperature must be > 0 and top_p in (0, 1], got {self.temperature}, {self.top_p}")


@dataclass
class Trajectory:
    """One sampled response to one prompt."""

    prompt_index: int                 # position of the prompt in the generate() call
    sample_index: int                 # 0..n-1 within the prompt's group
    prompt_ids: list[int]             # tokens fed as the prompt (BOS included)
    response_ids: list[int]           # sampled tokens, EOS included when finish_reason is EOS
    logprobs: torch.Tensor            # [R] float32: log softmax(logits / T) of each sampled token at the rollout
    finish_reason: FinishReason
    weight_version: int               # weights that produced it (0 = initial)
    # layer -> [P + R - 1, top_k] int64: experts chosen at every fed position (the last sampled token is
    # never fed). Empty when the engine cannot record routing.
    routing: dict[int, torch.Tensor] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass
class RolloutResult:
    """Trajectories in prompt-major order (prompt 0's n samples, then prompt 1's ...) and how long it took."""

    trajectories: list[Trajectory]
    generated_tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else float("nan")
