"""Ray actors that hold one backend (trainer worker, rollout engine) each, pinned to a placement bundle.

The actor is a thin generic forwarder: ``invoke(method, *args, **kwargs)`` calls the backend. Why not one
actor class per backend with explicit methods: the backend interfaces (``RolloutEngine``, the trainer) are
typed Protocols owned by their packages and still changing; explicit actor methods would duplicate them here
and break on every change, while the forwarder needs nothing but a factory. What a typed actor would add
(naming the failing call) ``call`` adds instead: every error names the worker and the method.

The backend is built *inside* the worker by a factory (a picklable callable, or a ``"module:attr"`` string so
the driver need not import heavy backends), so weights load on the node that uses them and never travel
through the driver.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any, Callable

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError, RayActorError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from repro.cluster import ClusterError
from repro.cluster.placement import PlacedGroups

Factory = Callable[..., Any] | str


class WorkerDiedError(ClusterError):
    """A worker actor died or stopped answering; the message names it and the call it was in."""


def resolve_factory(factory: Factory) -> Callable[..., Any]:
    if callable(factory):
        return factory
    module, _, attr = factory.partition(":")
    if not attr:
        raise ClusterError(f"backend factory {factory!r}: expected 'package.module:callable'")
    return getattr(importlib.import_module(module), attr)


@ray.remote(max_restarts=0, max_task_retries=0)
class BackendWorker:
    """Holds ``factory(*args, **kwargs)`` and forwards calls to it."""

    def __init__(self, name: str, factory: Factory, args: tuple, kwargs: dict):
        self.name = name
        self.backend = resolve_factory(factory)(*args, **kwargs)

    def invoke(self, method: str, *args: Any, **kwargs: Any) -> Any:
        target = getattr(self.backend, method, None)
        if not callable(target):
            raise ClusterError(f"{self.name}: backend {type(self.backend).__name__} has no method {method!r}")
        return target(*args, **kwargs)

    def where(self) -> dict[str, Any]:
        """Process and node this worker runs in, for placement checks and logs."""
        context = ray.get_runtime_context()
        return {"name": self.name, "pid": os.getpid(), "node_id": context.get_node_id(),
                "gpu_ids": ray.get_gpu_ids()}


@dataclass(frozen=True)
class WorkerHandle:
    name: str  # "rollout worker 0", "trainer worker 13": what errors call it
    group: str
    index: int
    actor: Any  # ray.actor.ActorHandle of BackendWorker


def start_worker(
    placed: PlacedGroups,
    group: str,
    index: int,
    factory: Factory,
    args: tuple = (),
    kwargs: dict | None = None,
    env: dict[str, str] | None = None,
) -> WorkerHandle:
    """Start one worker in bundle ``index`` of ``group``, reserving exactly that bundle's resources."""
    pg, bundle_index = placed.bundle(group, index)
    resources = dict(placed.plan.group(group).bundles[index])
    name = f"{group} worker {index}"
    options: dict[str, Any] = {
        "num_cpus": resources.pop("CPU", 0),
        "num_gpus": resources.pop("GPU", 0),
        "resources": resources or None,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=bundle_index
        ),
    }
    if env:
        options["runtime_env"] = {"env_vars": dict(env)}
    actor = BackendWorker.options(**options).remote(name, factory, tuple(args), dict(kwargs or {}))
    return WorkerHandle(name, group, index, actor)


def start_group(placed: PlacedGroups, group: str, factory: Factory, args: tuple = (), kwargs: dict | None = None,
                env: dict[str, str] | None = None) -> list[WorkerHandle]:
    """One worker per bundle of ``group``, in rank order."""
    count = len(placed.plan.group(group).bundles)
    return [start_worker(placed, group, i, factory, args, kwargs, env) for i in range(count)]


def call(worker: WorkerHandle | Any, method: str, *args: Any, name: str | None = None,
         timeout_s: float | None = None, **kwargs: Any) -> Any:
    """``worker.invoke(method, ...)`` and wait; a dead or silent worker becomes a WorkerDiedError naming it."""
    label = name or getattr(worker, "name", None) or repr(worker)
    actor = getattr(worker, "actor", worker)
    return _get(actor.invoke.remote(method, *args, **kwargs), label, method, timeout_s)


def call_all(workers: list[WorkerHandle], method: str, *args: Any, timeout_s: float | None = None,
             **kwargs: Any) -> list[Any]:
    """The same call on every worker at once (e.g. a trainer step on all ranks); results in rank order."""
    refs = [w.actor.invoke.remote(method, *args, **kwargs) for w in workers]
    return [_get(ref, w.name, method, timeout_s) for ref, w in zip(refs, workers)]


def where(worker: WorkerHandle, timeout_s: float | None = None) -> dict[str, Any]:
    return _get(worker.actor.where.remote(), worker.name, "where", timeout_s)


def _get(ref: Any, label: str, method: str, timeout_s: float | None) -> Any:
    try:
        return ray.get(ref, timeout=timeout_s)
    except (ActorDiedError, RayActorError, ActorUnavailableError) as err:
        # RayActorError also covers a backend whose constructor raised: its cause is in the message
        cause = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise WorkerDiedError(f"{label} died during {method}: {cause}") from err
    except GetTimeoutError as err:
        raise WorkerDiedError(f"{label} did not answer {method} within {timeout_s:g} s") from err


def stop_workers(workers: list[WorkerHandle]) -> None:
    for worker in workers:
        ray.kill(worker.actor, no_restart=True)
