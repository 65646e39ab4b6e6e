"""The interface every trainer backend implements: ``EmbeddedTrainer`` (torch on CPU) and ``MegatronTrainer``
(megatron-core, one instance per rank). Both inherit the same GRPO steps (``repro.train.grpo_trainer``) and
declare what they can do in ``repro.recipes.backends.TRAINERS``.

A trainer worker (``repro.groups.workers.TrainerWorker``) holds one and serves the loop's calls:

    trainer.logprobs(batch, replay_routing)   # π_old, the trainer's own recompute (routing replayed)
    trainer.train_step(batch)                 # one step of updates on a batch whose old_logprobs are set
    trainer.scored_train_step(batch)          # one update that gives π_old from its own forward, where exact
    trainer.sync_weights() / sync_sender()    # what this rank sends in a weight sync, and as which sender
    trainer.save(dir) / trainer.load(dir)     # the full training state, resumable bit for bit
    trainer.state_parts()                     # what the state files are written from (repro.train.trainer_state)

Metric keys follow verl (``actor/loss``, ``actor/grad_norm``, ...) so curves sit next to AMD's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterator, Protocol

import torch

from repro.errors import ReproError
from repro.recipes.backends import TrainerCapabilities
from repro.train.batch import TrainBatch


class TrainerError(ReproError):
    """A batch or a saved state does not fit the trainer; the message names the tensor, field or file."""


@dataclass
class LogprobResult:
    """logprobs: [B, T] float32 log softmax(logits / T_sample) of each target; entropy: [B, T] float32 entropy
    of that distribution. Both are 0 wherever ``response_mask`` is False (prompt and padding positions)."""

    logprobs: torch.Tensor
    entropy: torch.Tensor


@dataclass(frozen=True)
class StateParts:
    """What a trainer's saved state is made of: its model, its optimizer (``opt``: the fp32-master AdamW's
    interface, ``repro.train.optimizer``), its compute dtype's name and its counters."""

    model: torch.nn.Module
    opt: Any
    dtype_name: str
    step: int      # completed train_step calls
    updates: int   # completed optimizer updates (drives the warm-up)
    bf16_gemm: str | None = None  # the BF16 GEMM path (repro.train.bf16_gemm) of a trainer that chooses one


class Trainer(Protocol):
    capabilities: ClassVar[TrainerCapabilities]
    step: int  # completed train_step calls

    def logprobs(self, batch: TrainBatch, replay_routing: bool = True) -> LogprobResult:
        """Score the batch's targets under the current weights, no gradient."""

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """Update on ``batch`` (needs ``batch.old_logprobs``); returns verl-named ``actor/*`` metrics."""

    def scored_train_step(self, batch: TrainBatch) -> tuple[LogprobResult, dict[str, float]]:
        """One update on ``batch`` (no ``old_logprobs``) whose own first forward gives pi_old: (pi_old, metrics).
        Only where ``capabilities.scores_in_update`` and ``repro.train.grpo_update.scores_in_update`` hold."""

    def gradients(self, batch: TrainBatch) -> dict[str, torch.Tensor]:
        """name -> gradient of the first update's loss on ``batch``, without updating (contract tests, debugging)."""

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) of every weight a checkpoint stores, detached, on CPU."""

    def sync_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """What this rank sends in a weight sync, one tensor at a time (collective where the backend gathers)."""

    def sync_sender(self) -> int | None:
        """This rank's sender index in the weight sync, or None where it only helps gather."""

    def state_parts(self) -> StateParts:
        """The model, optimizer, dtype and counters the state files are written from."""

    def save(self, directory: str | Path) -> Path:
        """Write weights, optimizer state, step counters and RNG state."""

    def load(self, directory: str | Path) -> None:
        """Restore what ``save`` wrote; the next step is bit-identical to the saved trainer's."""
