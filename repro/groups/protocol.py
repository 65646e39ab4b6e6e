"""What the loop can ask of its two groups: every call is a named method, the same in this process and on Ray.

``repro.groups.workers`` implements both protocols in this process (``TrainerWorker``, ``RolloutWorker``: they
build the backend and own the weight-sync side of it); ``repro.groups.ray_groups`` implements them over Ray
actors that hold those same workers, one per trainer rank and one per rollout replica. The loop
(``repro.run.loop``) and its steps see only these two protocols.

Weight sync is two calls (``repro.sync``): ``trainer.send_weights(version)`` starts the trainer's side and returns
what it sends (``repro.sync.handoff``: the lazy bucket stream, ``LocalStream``, in this process; on Ray a
``RemoteSend``: where each sending rank's end of the rollout engine's wire meets, and the calls under way);
``rollout.receive_weights(sent, version)`` takes the sync through that wire and applies it as it arrives. No rollout
generates from a half-applied update: the engine refuses to generate from the first bucket until the last is
applied, and after a failed sync until a complete one succeeds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from repro.rollout.types import RolloutResult, SamplingParams
from repro.sync.apply import SyncStats
from repro.sync.handoff import LocalStream, RemoteSend
from repro.train.base import LogprobResult
from repro.train.batch import TrainBatch


class TrainerGroup(Protocol):
    def ready(self) -> None:
        """Return once every trainer process has built its model (on Ray, construction runs asynchronously)."""

    def logprobs(self, batch: TrainBatch, replay_routing: bool) -> LogprobResult:
        """[B, T] log-probs and entropies of the batch's targets under the current weights (no gradient)."""

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One step of updates on ``batch`` (its ``old_logprobs`` set); returns verl-named ``actor/*`` metrics."""

    def scored_train_step(self, batch: TrainBatch) -> tuple[LogprobResult, dict[str, float]]:
        """One update on ``batch`` (no ``old_logprobs``), pi_old from its own forward: (pi_old, metrics). Only
        where ``repro.train.grpo_update.old_logprobs_from_update`` holds (the backend can,
        ``repro.recipes.backends``)."""

    def send_weights(self, version: int) -> LocalStream | RemoteSend:
        """Start sending every weight, tagged ``version``; the result goes to ``RolloutGroup.receive_weights``."""

    def save(self, directory: Path) -> Path:
        """Write the full training state (weights, optimizer, RNG) under ``directory``."""

    def load(self, directory: Path) -> None:
        """Restore what ``save`` wrote; the next step is bit-identical to the saved trainer's."""


class RolloutGroup(Protocol):
    def ready(self) -> None:
        """Return once the engine is up and serving the initial weights."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutResult:
        """``params.n`` responses per prompt, prompt-major, with log-probs (and routing, for R3)."""

    def receive_weights(self, sent: LocalStream | RemoteSend, version: int) -> SyncStats:
        """Check and apply, bucket by bucket, what ``send_weights`` sent (FP8 re-quantised); a failure raises and
        leaves the engine refusing to generate until a complete sync succeeds."""
