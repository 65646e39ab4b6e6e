"""A trainer group of several ranks on Ray: one actor per placement bundle, together one torch.distributed world.

Rendezvous: rank 0's bundle is asked (a zero-CPU task scheduled into it) for its node address and a free port;
every rank then starts with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT in its environment, which
is what ``torch.distributed.init_process_group`` (and ``repro.train.megatron.parallel.init_distributed_from_env``)
reads. All constructors run at once, so the process group forms while the actors start.

Calls go to every rank (SPMD: a Megatron step is a collective) and return rank 0's answer; the ranks compute
the same result (the trainer broadcasts what only the last pipeline stage has). A rank that fails fails the call
at once, naming the rank, rather than leaving the others waiting in a collective.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from repro.groups.ray_actors import WorkerDiedError, WorkerHandle, start_worker
from repro.cluster.placement import TRAINER, PlacedGroups


def _free_port_here() -> tuple[str, int]:
    import ray

    with socket.socket() as sock:
        sock.bind(("", 0))
        return ray.util.get_node_ip_address(), sock.getsockname()[1]


def rendezvous_address(placed: PlacedGroups, group: str = TRAINER) -> tuple[str, int]:
    """(address, free port) on the node holding bundle 0 of ``group``, asked from inside that bundle."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg, index = placed.bundle(group, 0)
    probe = ray.remote(num_cpus=0)(_free_port_here).options(
        scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=index))
    return ray.get(probe.remote(), timeout=120)


def rank_env(rank: int, world: int, per_node: int, master: tuple[str, int]) -> dict[str, str]:
    """The torch.distributed environment of one rank (ranks fill nodes in order, ``per_node`` each)."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % per_node),
            "LOCAL_WORLD_SIZE": str(per_node), "MASTER_ADDR": master[0], "MASTER_PORT": str(master[1])}


@dataclass
class RankGroup:
    """Every rank of one SPMD group; ``call``/``submit`` reach all of them and give back rank 0's result."""

    workers: list[WorkerHandle]
    name: str = "trainer"

    def submit(self, method: str, *args: Any) -> Any:
        """Start ``method`` on every rank; rank 0's ObjectRef (the others run alongside, as the collective needs)."""
        refs = self._submit_all(method, *args)
        return refs[0]

    def call(self, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        return self._wait(self._submit_all(method, *args), method, timeout_s)[0]

    def call_all(self, method: str, *args: Any, timeout_s: float | None = None) -> list[Any]:
        """Every rank's answer, in rank order."""
        return self._wait(self._submit_all(method, *args), method, timeout_s)

    def _submit_all(self, method: str, *args: Any) -> list[Any]:
        import ray

        # a batch is put in the object store once for all ranks; ObjectRefs (sync buckets) pass as they are
        plain = (int, float, str, bool, type(None), ray.ObjectRef)
        shared = [a if isinstance(a, plain) or len(self.workers) == 1 else ray.put(a) for a in args]
        return [w.actor.invoke.remote(method, *shared) for w in self.workers]

    def _wait(self, refs: list[Any], method: str, timeout_s: float | None) -> list[Any]:
        """All results; the first rank to fail raises at once (its peers may be blocked in a collective)."""
        import ray
        from ray.exceptions import GetTimeoutError, RayError

        pending = {ref: i for i, ref in enumerate(refs)}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=timeout_s)
            if not done:
                raise WorkerDiedError(f"{self.name}: {len(pending)} rank(s) did not finish {method} within {timeout_s:g} s")
            rank = pending.pop(done[0])
            try:
                ray.get(done[0])
            except (RayError, GetTimeoutError) as err:
                cause = _cause(err)
                who = self.workers[rank].name + (f" (rank {rank})" if len(self.workers) > 1 else "")
                raise WorkerDiedError(f"{who} died during {method}: {cause}") from err
        return ray.get(refs)


def _cause(err: Exception) -> str:
    """The failing exception's own line (Ray's message starts with its task header and the remote traceback)."""
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(err).__name__


def start_ranks(placed: PlacedGroups, group: str, factory: str, args: tuple, *, per_node: int,
                env: dict[str, str] | None = None) -> RankGroup:
    """One actor per bundle of ``group``, rank i in bundle i, each with its rendezvous environment."""
    world = len(placed.plan.group(group).bundles)
    master = rendezvous_address(placed, group)
    workers = [start_worker(placed, group, rank, factory, args, env={**(env or {}), **rank_env(rank, world, per_node, master)})
               for rank in range(world)]
    return RankGroup(workers, name=f"{group} group")
