"""The worker of each group, a plain Python object: in this process it is the group itself (it implements
``repro.groups.protocol``), on Ray each actor holds one (``repro.groups.ray_groups``).

A worker builds its backend from the resolved recipe (a dict when it crossed a process boundary) and the model
folder, so weights load where they are used and never travel through the driver, and it holds its end of the
weight sync: in one process the trainer's lazy bucket stream is applied directly; on Ray both workers make the
rollout engine's wire from the recipe (``wire_of``; ``repro.sync.handoff.Wire``) -- the trainer's sending ranks
send through it, the rollout receives through it -- and Ray carries only the senders' addresses.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Hashable

import psutil

from repro.recipes.backends import build, rollout_of, trainer_of
from repro.recipes.schema import Recipe
from repro.rollout.base import RolloutEngine
from repro.rollout.types import RolloutResult, SamplingParams
from repro.sync.apply import SyncStats
from repro.sync.handoff import LocalStream, Senders, Wire, apply_local
from repro.sync.stream import pack_buckets
from repro.train.base import LogprobResult, Trainer
from repro.train.batch import TrainBatch


def _recipe(recipe: Recipe | dict) -> Recipe:
    return recipe if isinstance(recipe, Recipe) else Recipe.model_validate(recipe)


def wire_of(recipe: Recipe, model_dir: str | Path) -> Wire:
    """The weight wire of the recipe's rollout engine (``repro.recipes.backends.ROLLOUTS[...].wire``), made the same
    on the trainer's side and the rollout's."""
    return build(rollout_of(recipe).wire, recipe, model_dir)


def _node_host() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    return "127.0.0.1"


def this_process() -> dict:
    """The calling worker's process: its id and start time (together they name it even once the id is reused),
    its host, and the file its stderr goes to (on Ray, the worker's log under the session folder)."""
    try:
        log = os.readlink("/proc/self/fd/2")  # Linux; elsewhere the worker has no named log here
    except OSError:
        log = None
    return {"pid": os.getpid(), "create_time": psutil.Process().create_time(), "host": socket.gethostname(),
            "log": log}


class TrainerWorker:
    """One trainer process: the embedded trainer, or one rank of a Megatron world (its rendezvous environment set
    by ``repro.groups.ray_groups``; the model from ``actor.model_provider``, so ``model_dir`` is unused there)."""

    def __init__(self, recipe: Recipe | dict, model_dir: str | Path):
        recipe = _recipe(recipe)
        self.trainer: Trainer = build(trainer_of(recipe).builder, recipe, model_dir)
        self.bucket_bytes = recipe.weight_sync.bucket_mb * 1024 * 1024
        self.wire = wire_of(recipe, model_dir)  # the rollout engine's way across; this rank's end forms on first use

    def ready(self) -> None:
        """Construction is the warm-up; by the time this runs it is done."""

    def process(self) -> dict:
        return this_process()

    def logprobs(self, batch: TrainBatch, replay_routing: bool) -> LogprobResult:
        return self.trainer.logprobs(batch, replay_routing=replay_routing)

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        return self.trainer.train_step(batch)

    def scored_train_step(self, batch: TrainBatch) -> tuple[LogprobResult, dict[str, float]]:
        return self.trainer.scored_train_step(batch)

    def sender_index(self) -> int | None:
        """Which sync sender this rank is (None: it only helps gather). A Megatron world sends from the first
        rank of each pipeline stage, which gathers its stage's weights; the embedded trainer is one rank."""
        return self.trainer.sync_sender()

    def sync_address(self) -> Hashable | None:
        """Where this rank's end of the rollout's wire will meet (a free port on its node), or None for a rank that
        does not send."""
        sender = self.sender_index()
        return None if sender is None else self.wire.address(sender, _node_host())

    def send_weights(self, version: int) -> LocalStream:
        """In one process (one trainer rank): every weight in buckets, packed one tensor at a time as the rollout
        reads them (``RolloutWorker.receive_weights``)."""
        return LocalStream(pack_buckets(self.trainer.sync_weights(), self.bucket_bytes, version, self.sender_index()))

    def broadcast_weights(self, version: int, address: Hashable | None) -> int:
        """On Ray: every weight through the rollout's wire to ``address``; returns the payload bytes sent (0 from a
        rank that only helps gather, ``address`` None)."""
        named = self.trainer.sync_weights()
        sender = self.sender_index()
        if sender is None or address is None:
            for _ in named:  # the collective gather needs this rank; its share arrives at rank 0
                pass
            return 0
        return self.wire.send(named, address, version, sender)

    def save(self, directory: str | Path) -> Path:
        return Path(self.trainer.save(directory))

    def load(self, directory: str | Path) -> None:
        self.trainer.load(directory)


class RolloutWorker:
    """The rollout engine a recipe names (``repro.recipes.backends.ROLLOUTS``): the embedded CPU engine, or vLLM."""

    def __init__(self, recipe: Recipe | dict, model_dir: str | Path):
        recipe = _recipe(recipe)
        self.engine: RolloutEngine = build(rollout_of(recipe).builder, recipe, model_dir)
        self.wire = wire_of(recipe, model_dir)  # on Ray: the senders' ends it joined, kept between syncs

    def ready(self) -> None:
        """Construction is the warm-up; by the time this runs it is done."""

    def process(self) -> dict:
        return this_process()

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutResult:
        return self.engine.generate(prompts, params)

    def receive_weights(self, source: LocalStream | Senders, version: int) -> SyncStats:
        """Apply a sync: the trainer's bucket stream (one process), or on Ray through the engine's wire from the
        senders' addresses. A bad bucket fails the sync and leaves the engine refusing to generate."""
        if isinstance(source, LocalStream):
            return apply_local(self.engine, source, version)
        return self.wire.receive(self.engine, source.addresses, version)

    def weight_version(self) -> int:
        return self.engine.weight_version
