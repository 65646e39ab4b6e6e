"""The worker of each group, a plain Python object: in this process it is the group itself (it implements
``repro.groups.protocol``), on Ray each actor holds one (``repro.groups.ray_groups``).

A worker builds its backend from the resolved recipe (a dict when it crossed a process boundary) and the model
folder, so weights load where they are used and never travel through the driver, and it owns its side of the
weight sync (``repro.sync``): the trainer worker packs its weights, one tensor at a time, into buckets; the
rollout worker checks and applies them bucket by bucket. In one process the buckets pass as a lazy iterator;
on Ray over the sync's own collective groups (``repro.sync.group``), whose addresses are all Ray carries.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import psutil

from repro.model.served import served_from_folder
from repro.recipes.backends import build, rollout_of, sync_receivers, trainer_of
from repro.recipes.schema import Recipe
from repro.rollout.base import RolloutEngine
from repro.rollout.types import RolloutResult, SamplingParams
from repro.rollout.vllm_args import uses_vllm_transfer
from repro.rollout.vllm_transfer import TransferAddress, transfer_address
from repro.sync.apply import SyncStats
from repro.sync.group import SyncAddress, free_address
from repro.sync.handoff import JoinedGroups, LocalStream, SenderEnd, WeightSource, receive
from repro.sync.stream import pack_buckets
from repro.train.base import LogprobResult, Trainer
from repro.train.batch import TrainBatch


def _recipe(recipe: Recipe | dict) -> Recipe:
    return recipe if isinstance(recipe, Recipe) else Recipe.model_validate(recipe)


def sync_backend(recipe: Recipe) -> str:
    """gloo on CPU lanes, and where trainer and rollout share one GPU (``cluster.colocate: gpu``: NCCL refuses two
    ranks on one device, "Duplicate GPU detected"); NCCL (RCCL on ROCm) where the rollout has GPUs of its own."""
    return "nccl" if recipe.cluster.gpus_per_node > 0 and recipe.cluster.colocate != "gpu" else "gloo"


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
        self.receivers, self.backend = sync_receivers(recipe), sync_backend(recipe)
        self.timeout_s = recipe.weight_sync.timeout_s
        self.model_dir = Path(model_dir)
        self.vllm_transfer = uses_vllm_transfer(recipe)  # vLLM's own weight-transfer engine, else repro's stream
        self.sender_end = SenderEnd(self.bucket_bytes)  # this rank's sync group or transfer sender, formed on use

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

    def sync_address(self) -> SyncAddress | TransferAddress | None:
        """Where this rank's sync group will meet (a free port on its node), or None for a non-sending rank; with
        vLLM's weight-transfer engine, its group's address carrying the served checkpoint's tensors as update info."""
        sender = self.sender_index()
        if sender is None:
            return None
        host, port = free_address(_node_host())
        if self.vllm_transfer:
            return transfer_address(host, port, self.receivers, self.bucket_bytes, served_from_folder(self.model_dir))
        return SyncAddress(host, port, sender, self.receivers, self.backend, self.timeout_s)

    def send_weights(self, version: int) -> LocalStream:
        """In one process (one trainer rank): every weight in buckets, packed one tensor at a time as the rollout
        reads them (``RolloutWorker.receive_weights``)."""
        return LocalStream(pack_buckets(self.trainer.sync_weights(), self.bucket_bytes, version, self.sender_index()))

    def broadcast_weights(self, version: int, address: SyncAddress | TransferAddress | None) -> int:
        """On Ray: every weight, broadcast on this rank's sync group (formed on first use), or through vLLM's
        weight-transfer engine for a ``TransferAddress``; returns the payload bytes sent (0 from a rank that only
        helps gather, ``address`` None)."""
        named = self.trainer.sync_weights()
        sender = self.sender_index()
        if sender is None or address is None:
            for _ in named:  # the collective gather needs this rank; its share arrives at rank 0
                pass
            return 0
        return self.sender_end.send(named, address, version, sender)

    def save(self, directory: str | Path) -> Path:
        return Path(self.trainer.save(directory))

    def load(self, directory: str | Path) -> None:
        self.trainer.load(directory)


class RolloutWorker:
    """The rollout engine a recipe names (``repro.recipes.backends.ROLLOUTS``): the embedded CPU engine, or vLLM."""

    def __init__(self, recipe: Recipe | dict, model_dir: str | Path):
        recipe = _recipe(recipe)
        self.engine: RolloutEngine = build(rollout_of(recipe).builder, recipe, model_dir)
        self.joined = JoinedGroups()  # the senders' sync groups this process joined (Ray; kept between syncs)

    def ready(self) -> None:
        """Construction is the warm-up; by the time this runs it is done."""

    def process(self) -> dict:
        return this_process()

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutResult:
        return self.engine.generate(prompts, params)

    def receive_weights(self, source: WeightSource, version: int) -> SyncStats:
        """Apply a sync bucket by bucket (``repro.sync.handoff.receive``): the trainer's bucket stream (one
        process), or the senders' groups or vLLM's transfer group (Ray). A bad bucket fails the sync and leaves the
        engine refusing to generate."""
        return receive(self.engine, source, version, self.joined)

    def weight_version(self) -> int:
        return self.engine.weight_version
