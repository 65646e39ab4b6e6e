"""The two groups on Ray: one actor per trainer rank (together one torch.distributed world) and one rollout actor,
each pinned to its bundle of the recipe's placement. Both implement ``repro.groups.protocol``.

Trainer calls go to every rank at once (SPMD: a Megatron step is a collective) and return rank 0's answer; the
ranks compute the same result (the trainer broadcasts what only the last pipeline stage has). A batch is put in
the object store once for all ranks. Weight sync: on the first sync each sending rank names a free port on its
node (``sync_address``); ``send_weights`` starts every rank's send without waiting and returns those addresses,
and the rollout actor joins each sender's collective group (``repro.sync.group``) and receives the buckets
there. Ray carries only the addresses and the calls; the weights never pass through the object store or the
driver.

Rendezvous: rank 0's bundle is asked (a zero-CPU task scheduled into it) for its node address and a free port;
every rank then starts with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT in its environment, which
``torch.distributed`` (and ``repro.train.megatron.parallel.init_distributed_from_env``) reads.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Hashable

from repro.cluster.placement import ROLLOUT, TRAINER, Placement
from repro.errors import ReproError
from repro.groups.ray_actors import start_actor, wait_all
from repro.groups.workers import RolloutWorker, TrainerWorker
from repro.recipes.backends import trainer_of
from repro.recipes.schema import Recipe
from repro.rollout.types import RolloutResult, SamplingParams
from repro.sync.apply import SyncStats
from repro.sync.handoff import RemoteSend, Senders
from repro.train.base import LogprobResult
from repro.train.batch import TrainBatch
from repro.train.threads import worker_thread_env


@dataclass
class RayTrainerGroup:
    """Every trainer rank; each method runs on all of them and returns rank 0's answer."""

    ranks: list[Any]  # actor handles of TrainerWorker, rank order
    timeout_s: float | None = None
    sync_addresses: list[Hashable | None] | None = None  # per rank, on the rollout's wire; asked on the first sync

    @property
    def names(self) -> list[str]:
        if len(self.ranks) == 1:
            return ["trainer worker 0"]
        return [f"trainer worker {i} (rank {i})" for i in range(len(self.ranks))]

    def _shared(self, value: Any) -> Any:
        import ray

        return ray.put(value) if len(self.ranks) > 1 else value

    def ready(self) -> None:
        wait_all([r.ready.remote() for r in self.ranks], self.names, "start-up", self.timeout_s)

    def processes(self) -> list[dict]:
        """Each rank's process (``repro.groups.workers.this_process``) with its name."""
        found = wait_all([r.process.remote() for r in self.ranks], self.names, "process", self.timeout_s)
        return [{"name": name, **info} for name, info in zip(self.names, found)]

    def logprobs(self, batch: TrainBatch, replay_routing: bool) -> LogprobResult:
        batch = self._shared(batch)
        return wait_all([r.logprobs.remote(batch, replay_routing) for r in self.ranks], self.names, "logprobs",
                        self.timeout_s)[0]

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        batch = self._shared(batch)
        return wait_all([r.train_step.remote(batch) for r in self.ranks], self.names, "train_step", self.timeout_s)[0]

    def scored_train_step(self, batch: TrainBatch) -> tuple[LogprobResult, dict[str, float]]:
        batch = self._shared(batch)
        return wait_all([r.scored_train_step.remote(batch) for r in self.ranks], self.names, "scored_train_step",
                        self.timeout_s)[0]

    def send_weights(self, version: int) -> RemoteSend:
        """Started on every rank (senders broadcast on their sync groups, the others help gather): where the
        rollout receives from, and the calls, which must finish too."""
        if self.sync_addresses is None:
            self.sync_addresses = wait_all([r.sync_address.remote() for r in self.ranks], self.names, "sync_address",
                                           self.timeout_s)
        refs = [r.broadcast_weights.remote(version, address) for r, address in zip(self.ranks, self.sync_addresses)]
        return RemoteSend(Senders(tuple(a for a in self.sync_addresses if a is not None)), refs, self.names,
                          failed=self.forget_sync_addresses)

    def forget_sync_addresses(self) -> None:
        """After a failed sync: the next one asks every rank for a new address, so senders and receivers all form
        new groups (a receiver that re-joins the old address would wait for a sender that never comes back)."""
        self.sync_addresses = None

    def save(self, directory: Path) -> Path:
        return Path(wait_all([r.save.remote(str(directory)) for r in self.ranks], self.names, "save",
                             self.timeout_s)[0])

    def load(self, directory: Path) -> None:
        wait_all([r.load.remote(str(directory)) for r in self.ranks], self.names, "load", self.timeout_s)


@dataclass
class RayRolloutGroup:
    """The rollout replica's actor."""

    actor: Any  # actor handle of RolloutWorker
    timeout_s: float | None = None
    name: str = "rollout worker 0"

    def ready(self) -> None:
        wait_all([self.actor.ready.remote()], [self.name], "start-up", self.timeout_s)

    def processes(self) -> list[dict]:
        found = wait_all([self.actor.process.remote()], [self.name], "process", self.timeout_s)
        return [{"name": self.name, **found[0]}]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutResult:
        return wait_all([self.actor.generate.remote(prompts, params)], [self.name], "generate", self.timeout_s)[0]

    def receive_weights(self, sent: RemoteSend, version: int) -> SyncStats:
        """Receive on the senders' groups while they send; the first side to fail raises, naming itself."""
        received = self.actor.receive_weights.remote(sent.source, version)
        try:
            return wait_all([received, *sent.calls], [self.name, *sent.call_names], "weight sync", self.timeout_s)[0]
        except BaseException:
            sent.failed()
            raise


def _free_port_here() -> tuple[str, int]:
    import ray

    with socket.socket() as sock:
        sock.bind(("", 0))
        return ray.util.get_node_ip_address(), sock.getsockname()[1]


def rendezvous_address(placement: Placement, group: str = TRAINER) -> tuple[str, int]:
    """(address, free port) on the node holding bundle 0 of ``group``, asked from inside that bundle."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg, index = placement.bundle(group, 0)
    probe = ray.remote(num_cpus=0)(_free_port_here).options(
        scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=index))
    return ray.get(probe.remote(), timeout=120)


def rank_env(rank: int, world: int, per_node: int, master: tuple[str, int]) -> dict[str, str]:
    """The torch.distributed environment of one rank (ranks fill nodes in order, ``per_node`` each)."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % per_node),
            "LOCAL_WORLD_SIZE": str(per_node), "MASTER_ADDR": master[0], "MASTER_PORT": str(master[1])}


def start_trainer_ranks(placement: Placement, recipe: Recipe | dict, model_dir: str, *, per_node: int,
                        env: dict[str, str] | None = None) -> RayTrainerGroup:
    """One TrainerWorker actor per trainer bundle, rank i in bundle i, each with its rendezvous environment
    (a single rank needs none). All constructors run at once, so the process group forms while they start."""
    world = len(placement.plan.group(TRAINER).bundles)
    spec = recipe.model_dump(mode="json") if isinstance(recipe, Recipe) else recipe
    if world == 1:
        return RayTrainerGroup([start_actor(placement, TRAINER, 0, TrainerWorker, (spec, model_dir), env=env)])
    master = rendezvous_address(placement, TRAINER)
    return RayTrainerGroup([
        start_actor(placement, TRAINER, rank, TrainerWorker, (spec, model_dir),
                    env={**(env or {}), **rank_env(rank, world, per_node, master)})
        for rank in range(world)
    ])


def start_groups(placement: Placement, recipe: Recipe, model_dir: Path) -> tuple[RayTrainerGroup, RayRolloutGroup]:
    """The recipe's trainer rank(s) and its rollout replica, started in their bundles (not yet waited for)."""
    check_group_sizes(recipe)
    spec = recipe.model_dump(mode="json")
    env = cpu_worker_env(recipe.cluster.cpu_threads_per_worker) if recipe.cluster.gpus_per_node == 0 else None
    trainer = start_trainer_ranks(placement, spec, str(model_dir),
                                  per_node=recipe.actor.num_workers // recipe.actor.nodes, env=env)
    rollout = RayRolloutGroup(start_actor(placement, ROLLOUT, 0, RolloutWorker, (spec, str(model_dir)), env=env))
    return trainer, rollout


def cpu_worker_env(threads: int) -> dict[str, str]:
    """A CPU worker's thread settings (``repro.train.threads.worker_thread_env``)."""
    return worker_thread_env(threads)


def check_group_sizes(recipe: Recipe) -> None:
    """Refuse, naming the fields, layouts these groups do not start."""
    if recipe.rollout.num_replicas != 1:
        raise ReproError(
            f"rollout.num_replicas={recipe.rollout.num_replicas}: one rollout replica is started (AMD runs one TP8 "
            "vLLM replica); several replicas need a request router in front of them, not built"
        )
    if trainer_of(recipe).one_worker and recipe.actor.num_workers != 1:
        raise ReproError(
            f"actor.num_workers={recipe.actor.num_workers}: the embedded trainer is one process; several trainer "
            "ranks need actor.backend: megatron"
        )
