"""The interface every trainer backend implements: ``EmbeddedTrainer`` (torch on CPU) and ``MegatronTrainer``
(megatron-core, one instance per rank). Both compose the same GRPO update (``repro.train.grpo_update``).

A trainer worker (``repro.groups.workers.TrainerWorker``) holds one and serves the loop's calls:

    trainer.logprobs(batch, replay_routing)   # π_old, the trainer's own recompute (routing replayed)
    trainer.train_step(batch)                 # one step of updates on a batch whose old_logprobs are set
    trainer.named_weights()                   # every weight, for the sync to the rollout
    trainer.save(dir) / trainer.load(dir)     # the full training state, resumable bit for bit

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
