"""The worker of each group, a plain Python object: in this process it is the group itself (it implements
``repro.groups.protocol``), on Ray each actor holds one (``repro.groups.ray_groups``).

A worker builds its backend from the resolved recipe (a dict when it crossed a process boundary) and the model
folder, so weights load where they are used and never travel through the driver, and it owns its side of the
weight sync (``repro.sync``): the trainer worker packs its weights, one tensor at a time, into buckets; the
rollout worker checks and applies them bucket by bucket. In one process the buckets pass as a lazy iterator;
on Ray over the sync's own collective groups (``repro.sync_group``), whose addresses are all Ray carries.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Iterable, Iterator

from repro.recipes.backends import build, trainer_of
from repro.recipes.schema import Recipe
from repro.rollout.types import RolloutResult, SamplingParams
from repro.rollout.vllm_engine import uses_vllm_transfer
from repro.rollout.vllm_transfer import TransferAddress
from repro.sync import PackedBucket, SyncStats, apply_stream, drain, pack_buckets
from repro.sync_group import SyncAddress, SyncGroup, free_address, receive_all
from repro.train.base import LogprobResult, Trainer
from repro.train.batch import TrainBatch


def _recipe(recipe: Recipe | dict) -> Recipe:
    return recipe if isinstance(recipe, Recipe) else Recipe.model_validate(recipe)


def sync_receivers(recipe: Recipe) -> int:
    """Processes that receive a weight sync: every vLLM tensor-parallel worker, or the one embedded engine."""
    return recipe.rollout.tensor_parallel if recipe.rollout.backend == "vllm" else 1


def sync_backend(recipe: Recipe) -> str:
    """gloo on CPU lanes; NCCL (RCCL on ROCm) where the rollout runs on GPUs."""
    return "nccl" if recipe.cluster.gpus_per_node > 0 else "gloo"


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
    import psutil

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
        self.group: SyncGroup | None = None
        self.model_dir = Path(model_dir)
        self.vllm_transfer = uses_vllm_transfer(recipe)  # vLLM's own weight-transfer engine, else repro's stream
        self.transfer = None  # repro.rollout.vllm_transfer.TransferSender, formed on the first sync

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
            from repro.model.served import served_from_folder
            from repro.rollout.vllm_transfer import transfer_address

            return transfer_address(host, port, self.receivers, self.bucket_bytes, served_from_folder(self.model_dir))
        return SyncAddress(host, port, sender, self.receivers, self.backend, self.timeout_s)

    def send_weights(self, version: int, address: SyncAddress | TransferAddress | None = None
                     ) -> Iterator[PackedBucket] | int:
        """Every weight in buckets, packed one tensor at a time. In one process (no ``address``): the lazy
        bucket stream, for ``RolloutWorker.receive_weights``. On Ray: broadcast on this rank's sync group
        (formed on first use), or through vLLM's weight-transfer engine for a ``TransferAddress``; returns the
        payload bytes sent (0 from a rank that only helps gather)."""
        named = self.trainer.sync_weights()
        sender = self.sender_index()
        if sender is None:
            for _ in named:  # the collective gather needs this rank; its share arrives at rank 0
                pass
            return 0
        if address is None:
            return pack_buckets(named, self.bucket_bytes, version, sender)
        if isinstance(address, TransferAddress):
            from repro.rollout.vllm_transfer import TransferSender

            if self.transfer is None or self.transfer.address != address:
                self.transfer = TransferSender(address)
            return self.transfer.send(named, version)
        if self.group is None or self.group.address != address:
            self.group = SyncGroup(address, rank=0)
        return self.group.send(pack_buckets(named, self.bucket_bytes, version, sender))

    def save(self, directory: str | Path) -> Path:
        return Path(self.trainer.save(directory))

    def load(self, directory: str | Path) -> None:
        self.trainer.load(directory)


class RolloutWorker:
    """The rollout engine a recipe names: the embedded CPU engine, or vLLM."""

    def __init__(self, recipe: Recipe | dict, model_dir: str | Path):
        recipe = _recipe(recipe)
        if recipe.rollout.backend == "vllm":  # needs vllm installed (`make test-vllm` builds .venv-vllm)
            from transformers import AutoTokenizer

            from repro.rollout.vllm_engine import VLLMEngine

            eos_id = AutoTokenizer.from_pretrained(model_dir).eos_token_id
            self.engine = VLLMEngine.from_recipe(recipe, model_dir, eos_id=eos_id)
            return
        from repro.model.hf_folder import load_checkpoint
        from repro.rollout.embedded import EmbeddedEngine
        from repro.rollout.fp8_view import weight_view_for
        from repro.rollout.numerics import RolloutNumerics

        model, tokenizer = load_checkpoint(model_dir)
        r = recipe.rollout
        self.weight_view = weight_view_for(r.weight_format, r.fp8_format, r.fp8_block, r.fp8_scale)
        self.engine = EmbeddedEngine(
            model,
            eos_id=tokenizer.eos_token_id,
            pad_id=tokenizer.pad_token_id,
            max_context=recipe.lengths.max_context,
            weight_view=self.weight_view,
            record_routing=recipe.routing_replay.enabled,
            numerics=RolloutNumerics.from_rollout(r),
            logprobs_mode=r.logprobs_mode,
        )

    def ready(self) -> None:
        """Construction is the warm-up; by the time this runs it is done."""

    def process(self) -> dict:
        return this_process()

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutResult:
        return self.engine.generate(prompts, params)

    def receive_weights(self, sent: Iterable[PackedBucket] | list[SyncAddress], version: int) -> SyncStats:
        """Apply a sync bucket by bucket: ``sent`` is the trainer's bucket stream (one process) or the addresses
        of the senders' groups (Ray). A bad bucket fails the sync and leaves the engine refusing to generate;
        the rest of the stream is still drained, so the senders finish and the next sync starts clean."""
        if isinstance(sent, list) and len(sent) == 1 and isinstance(sent[0], TransferAddress):
            return self.engine.receive_transfer(sent[0], version)  # vLLM's own weight-transfer engine
        if isinstance(sent, list) and all(isinstance(a, SyncAddress) for a in sent):
            if hasattr(self.engine, "receive_from_groups"):  # vLLM: its workers join the groups themselves
                return self.engine.receive_from_groups(sent, version)
            stream, senders = receive_all(self._groups(sent), version), len(sent)
        else:
            stream, senders = iter(sent), 1
        try:
            return apply_stream(self.engine, stream, version, senders)
        except Exception:
            drain(stream)
            raise

    def _groups(self, addresses: list[SyncAddress]) -> list[SyncGroup]:
        known = {g.address: g for g in getattr(self, "groups", [])}
        self.groups = [known.get(a) or SyncGroup(a, rank=1) for a in addresses]
        return self.groups

    def weight_version(self) -> int:
        return self.engine.weight_version
