"""The interface every trainer backend implements: the embedded CPU trainer now, Megatron-core later.

The RL loop only ever calls these methods, so a backend is free in how it shards, offloads or fuses:

    old = trainer.logprobs(batch).logprobs          # π_old, the trainer's own recompute (routing replayed)
    batch.old_logprobs = old
    metrics = trainer.train_step(batch)             # one or more optimizer updates on the batch
    engine.update_weights(trainer.named_weights(), version)
    trainer.save(ckpt_dir) / trainer.load(ckpt_dir) # the full training state, resumable bit for bit

Metric keys follow verl (``actor/loss``, ``actor/grad_norm``, ...) so curves sit next to AMD's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol

import torch

from repro.errors import ReproError
from repro.train.batch import TrainBatch


class TrainerError(ReproError):
    """A batch or a saved state does not fit the trainer; the message names the tensor, field or file."""


@dataclass
class LogprobResult:
    """logprobs: [B, T] float32 log softmax(logits / T_sample) of each target; entropy: [B, T] float32 entropy
    of that distribution. Both are 0 wherever ``response_mask`` is False (prompt and padding positions)."""

    logprobs: torch.Tensor
    entropy: torch.Tensor


class Trainer(Protocol):
    step: int  # completed train_step calls

    def logprobs(self, batch: TrainBatch, replay_routing: bool = True) -> LogprobResult:
        """Score the batch's targets under the current weights, no gradient."""

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """Update on ``batch`` (needs ``batch.old_logprobs``); returns verl-named ``actor/*`` metrics."""

    def gradients(self, batch: TrainBatch) -> dict[str, torch.Tensor]:
        """name -> gradient of the first update's loss on ``batch``, without updating (contract tests, debugging)."""

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) of every weight a checkpoint stores, detached, on CPU, for weight sync."""

    def save(self, directory: str | Path) -> Path:
        """Write weights, optimizer state, step counters and RNG state."""

    def load(self, directory: str | Path) -> None:
        """Restore what ``save`` wrote; the next step is bit-identical to the saved trainer's."""
