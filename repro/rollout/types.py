"""What a rollout engine returns: one record per sampled response, whichever backend produced it.

A ``RolloutResult`` crosses process boundaries (rollout actor -> driver on Ray) as a few stacked tensors plus
offsets (``pack_trajectories``), not as one pickled object per trajectory: 256 trajectories hold ~1,000 small
tensors, and pickling each one costs far more than its bytes (issue 19).
"""

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
    """Trajectories in prompt-major order (prompt 0's n samples, then prompt 1's ...) and how long it took.

    Pickled as stacked tensors (``pack_trajectories``); unpickled trajectories hold views into those tensors."""

    trajectories: list[Trajectory]
    generated_tokens: int
    seconds: float

    def __getstate__(self) -> dict:
        return {"packed": pack_trajectories(self.trajectories), "generated_tokens": self.generated_tokens,
                "seconds": self.seconds}

    def __setstate__(self, state: dict) -> None:
        self.trajectories = unpack_trajectories(state["packed"])
        self.generated_tokens = state["generated_tokens"]
        self.seconds = state["seconds"]

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else float("nan")


FINISH_CODES = {reason: code for code, reason in enumerate(FinishReason)}


def pack_trajectories(trajectories: list[Trajectory]) -> dict:
    """The trajectories as a few concatenated tensors and their per-trajectory lengths (N = len(trajectories)).

    Trajectories whose tensors do not stack (log-probs of differing dtypes, routing over differing layers or
    dtypes) are kept as they are under ``"objects"``; nothing is converted, so unpacking gives equal values,
    dtypes and shapes."""
    if not trajectories:
        return {"objects": []}
    first = trajectories[0]
    layers = sorted(first.routing)
    stackable = all(
        t.logprobs.dtype == first.logprobs.dtype and t.logprobs.dim() == 1 and sorted(t.routing) == layers
        and all(t.routing[k].dtype == first.routing[k].dtype and t.routing[k].dim() == 2
                and t.routing[k].shape[1] == first.routing[k].shape[1] for k in layers)
        for t in trajectories
    )
    if not stackable:
        return {"objects": list(trajectories)}
    ints = torch.tensor([[t.prompt_index, t.sample_index, t.weight_version, FINISH_CODES[t.finish_reason],
                          len(t.prompt_ids), len(t.response_ids)] for t in trajectories], dtype=torch.int64)
    return {
        "ints": ints,  # [N, 6]: prompt_index, sample_index, weight_version, finish code, prompt len, response len
        "tokens": torch.tensor([i for t in trajectories for i in (*t.prompt_ids, *t.response_ids)], dtype=torch.int64),
        "logprobs": torch.cat([t.logprobs for t in trajectories]),
        "routing_rows": torch.tensor([[t.routing[k].shape[0] for k in layers] for t in trajectories],
                                     dtype=torch.int64).reshape(len(trajectories), len(layers)),
        "routing": {k: torch.cat([t.routing[k] for t in trajectories]) for k in layers},
    }


def unpack_trajectories(packed: dict) -> list[Trajectory]:
    """Inverse of ``pack_trajectories``: equal trajectories whose tensors are views into the packed ones."""
    if "objects" in packed:
        return list(packed["objects"])
    ints = packed["ints"].tolist()
    lengths = [p + r for *_, p, r in ints]
    tokens = packed["tokens"].tolist()
    logprobs = packed["logprobs"].split([r for *_, r in ints])
    layers = list(packed["routing"])
    routing_rows = packed["routing_rows"].T.tolist()
    routing = {k: packed["routing"][k].split(rows) for k, rows in zip(layers, routing_rows)}
    reasons = list(FinishReason)
    out, start = [], 0
    for i, (prompt_index, sample_index, version, code, prompt_len, _) in enumerate(ints):
        seq = tokens[start : start + lengths[i]]
        start += lengths[i]
        out.append(Trajectory(prompt_index, sample_index, seq[:prompt_len], seq[prompt_len:], logprobs[i],
                              reasons[code], version, {k: routing[k][i] for k in layers}))
    return out
