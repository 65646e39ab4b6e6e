"""Ray actors pinned to placement bundles, and waiting on them with errors that name the worker and the call.

An actor is started from a class (the group's worker, ``repro.groups.workers``) inside exactly one bundle of the
recipe's placement; its methods are called by name on the handle (``actor.train_step.remote(batch)``), so a
reader and a type checker follow the call into the worker class. The worker's constructor runs inside the actor,
so weights load on the node that uses them and never pass through the driver.
"""

from __future__ import annotations

import os
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError, RayActorError, RayError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from repro.cluster import ClusterError
from repro.cluster.placement import Placement
from repro.errors import SettingRefused, WorkerError

# After one worker fails a call, how long its peers in the same call get to show whether one of them died first:
# a receiver whose sender was killed mid-sync raises at once, before Ray reports the sender's death.
PEER_GRACE_S = 5.0


class WorkerDiedError(ClusterError, WorkerError):
    """A worker actor died, raised, or stopped answering; the message names it and the call it was in."""


def _worker_failure(name: str, call: str, err: Exception) -> WorkerDiedError:
    died = isinstance(err, (ActorDiedError, RayActorError, ActorUnavailableError))
    line = failure_line(err)
    # Ray re-raises a task's exception as a subclass of its class, so a worker's SettingRefused is still one here
    return WorkerDiedError(f"{name} {'died' if died else 'failed'} during {call}: {line}", worker=name, call=call,
                           cause=line, died=died, refused=isinstance(err, SettingRefused))


def start_actor(placement: Placement, group: str, index: int, cls: type, args: tuple = (), kwargs: dict | None = None,
                env: dict[str, str] | None = None) -> Any:
    """An actor of ``cls`` in bundle ``index`` of ``group``, reserving exactly that bundle's resources."""
    pg, bundle_index = placement.bundle(group, index)
    resources = dict(placement.plan.group(group).bundles[index])
    options: dict[str, Any] = {
        "num_cpus": resources.pop("CPU", 0),
        "num_gpus": resources.pop("GPU", 0),
        "resources": resources or None,
        "max_restarts": 0,
        "max_task_retries": 0,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=bundle_index
        ),
    }
    if env:
        options["runtime_env"] = {"env_vars": dict(env)}
    return ray.remote(cls).options(**options).remote(*args, **(kwargs or {}))


def wait_all(refs: list[Any], names: list[str], call: str, timeout_s: float | None = None) -> list[Any]:
    """Every result, in order; the first worker to fail raises at once, naming it and ``call`` (its peers may be
    blocked in a collective waiting for it, so waiting for them too would hang)."""
    pending = {ref: i for i, ref in enumerate(refs)}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1, timeout=timeout_s)
        if not done:
            waiting = ", ".join(names[i] for i in sorted(pending.values()))
            raise WorkerDiedError(f"{waiting}: did not finish {call} within {timeout_s:g} s", worker=waiting,
                                  call=call, cause=f"no answer within {timeout_s:g} s", died=True)
        index = pending.pop(done[0])
        try:
            ray.get(done[0])
        except (RayError, GetTimeoutError) as err:
            failure = _worker_failure(names[index], call, err)
            if not failure.died and pending:
                _raise_dead_peer(pending, names, call, failure)
            raise failure from err
    return ray.get(refs)


def _raise_dead_peer(pending: dict, names: list[str], call: str, failure: WorkerDiedError) -> None:
    """If a peer still in the call turns out dead within ``PEER_GRACE_S``, raise its death (the cause), naming
    ``failure`` (the consequence) beside it."""
    done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=PEER_GRACE_S)
    for ref in done:
        try:
            ray.get(ref)
        except (RayError, GetTimeoutError) as err:
            peer = _worker_failure(names[pending[ref]], call, err)
            if peer.died:
                raise WorkerDiedError(f"{peer} ({failure.worker} failed after it: {failure.cause})",
                                      worker=peer.worker, call=call, cause=peer.cause, died=True) from err


def failure_line(err: Exception) -> str:
    """The failing exception's own line (Ray's message starts with its task header and the remote traceback)."""
    if isinstance(err, (ActorDiedError, RayActorError, ActorUnavailableError)):
        # an actor whose constructor raised: the cause is on the message's first line
        text = str(err).strip()
        return text.splitlines()[0] if text else type(err).__name__
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(err).__name__


def where_am_i() -> dict[str, Any]:
    """Process and node of the calling actor, for placement checks and logs."""
    context = ray.get_runtime_context()
    return {"pid": os.getpid(), "node_id": context.get_node_id(), "gpu_ids": ray.get_gpu_ids()}


def stop_actors(actors: list[Any]) -> None:
    for actor in actors:
        ray.kill(actor, no_restart=True)
