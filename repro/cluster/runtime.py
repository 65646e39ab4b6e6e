"""Start or join Ray for a recipe.

``cluster.ray_address: null`` starts a local instance sized for the recipe's placement plan; ``"auto"`` or
``host:port`` joins a running cluster (``ray start --head`` on the AMD cluster's first node).

Token authentication (Ray 2.60 turns it on for every new ``ray.init()`` instance when ``RAY_AUTH_MODE`` is
unset, writing a token to ``~/.ray/auth_token``). Both modes were tried here: ``disabled`` and the default token
mode each start and run tasks. We start local instances with ``RAY_AUTH_MODE=disabled`` unless the user set the
variable, because the token mode writes into the user's home and every later ``ray``/``repro`` process must
then find that token; an explicit ``RAY_AUTH_MODE=token`` is respected. Note that Ray refuses a loopback node
address and its servers listen on all interfaces, so on a shared network prefer ``RAY_AUTH_MODE=token``.
Joining never changes the mode: a cluster started with tokens needs ``RAY_AUTH_MODE=token`` plus
``RAY_AUTH_TOKEN``/``RAY_AUTH_TOKEN_PATH`` in the driver's environment, as Ray documents.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from repro.cluster import ClusterError
from repro.cluster.placement import plan_placement

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe

# Environment of a local instance we start; setdefault, so the user's explicit choice wins.
LOCAL_INSTANCE_ENV = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
}
# The object store carries batches and results (weights go over the sync's own groups, repro.sync.group);
# Ray's default (30% of RAM) would claim ~7 GB of /dev/shm on a shared laptop.
LOCAL_OBJECT_STORE_BYTES = 512 * 1024**2
JOIN_PROBE_TIMEOUT_S = 5.0
# A local instance a parent process (the notebook chain) started for its children to share: a recipe with
# ``cluster.ray_address: null`` joins it instead of starting another (18-30 s each on 2 cores).
SHARED_INSTANCE_ENV = "REPRO_SHARED_RAY_ADDRESS"
# A local instance runs only what a run uses (benchmarks/ray_idle.py; Ray 2.60 on the tiny recipe, idle: 9 processes,
# 571 MiB USS before, 5 and ~285 MiB after): no idle workers prestarted per CPU (the two actors start their own),
# no task events or timeline sent to the GCS (nothing reads them: no dashboard), no metrics collection; and,
# where Ray's node API is as expected, neither the autoscaler's monitor (a fixed local node has nothing to scale)
# nor the log monitor (log_to_driver is off: workers' logs stay in their files).
LOCAL_SYSTEM_CONFIG = {
    "enable_worker_prestart": False,
    "prestart_worker_first_driver": False,
    "task_events_report_interval_ms": 0,
    "enable_timeline": False,
    "enable_metrics_collection": False,
}


@dataclass(frozen=True)
class RayInfo:
    address: str  # GCS address of the instance this driver is connected to
    started_local: bool  # True when ensure_ray started it (shutdown_ray then stops it)
    num_cpus: float
    num_gpus: float
    connect_s: float  # seconds ensure_ray took (0 when already connected)


_current: RayInfo | None = None
_local_node = None  # the ray._private.node.Node _start_local started itself (shutdown_ray kills its processes)


def ensure_ray(recipe: "Recipe") -> RayInfo:
    """Connect this process to Ray as the recipe says; a second call returns the first connection."""
    global _current
    import ray

    if ray.is_initialized():
        if _current is None:  # someone else (a test, a notebook) connected: adopt it, never stop it
            _current = _describe(started_local=False, connect_s=0.0)
        return _current
    started = time.perf_counter()
    address = recipe.cluster.ray_address
    shared = os.environ.get(SHARED_INSTANCE_ENV) if address is None else None
    if shared:
        _join(shared)
    elif address is None:
        _start_local(recipe)
    else:
        _join(address)
    _current = _describe(started_local=address is None and not shared, connect_s=time.perf_counter() - started)
    return _current


@contextmanager
def shared_local_instance(recipe: "Recipe", record: Path | None = None) -> Iterator[RayInfo | None]:
    """A local Ray instance that processes started inside the block (notebook kernels) join instead of each
    starting their own; nothing is started for a recipe that joins a cluster anyway."""
    if recipe.cluster.ray_address is not None or os.environ.get(SHARED_INSTANCE_ENV):
        yield None
        return
    info = ensure_ray(recipe)
    if record is not None:
        record_local_processes(record)
    os.environ[SHARED_INSTANCE_ENV] = info.address
    try:
        yield info
    finally:
        os.environ.pop(SHARED_INSTANCE_ENV, None)
        shutdown_ray()
        if record is not None:
            record.unlink(missing_ok=True)


def shutdown_ray() -> None:
    """Disconnect (and stop the local instance if we started it); safe to call when not connected."""
    global _current, _local_node
    import ray

    if ray.is_initialized():
        ray.shutdown()
    if _local_node is not None:
        _local_node.kill_all_processes(check_alive=False, allow_graceful=True)
        _local_node = None
    _current = None


def local_num_cpus(recipe: "Recipe") -> int:
    """CPUs a local instance offers: exactly what the placement plan reserves, at least 1."""
    needed = sum(b.get("CPU", 0) for g in plan_placement(recipe).groups for b in g.bundles)
    return max(1, math.ceil(needed))


def _start_local(recipe: "Recipe") -> None:
    import ray

    for key, value in LOCAL_INSTANCE_ENV.items():
        os.environ.setdefault(key, value)
    cpu_mode = recipe.cluster.gpus_per_node == 0
    for attempt in (1, 2):
        before = {p["pid"] for p in local_ray_processes()}
        # CPU mode offers exactly the plan's CPUs and no GPUs; a GPU recipe on one local box lets Ray detect them.
        resources = {"num_cpus": local_num_cpus(recipe) if cpu_mode else None, "num_gpus": 0 if cpu_mode else None,
                     "object_store_memory": LOCAL_OBJECT_STORE_BYTES}
        try:
            if not _start_small_node(resources):
                ray.init(
                    address="local",  # a new instance even if another one on this machine would be auto-detected
                    **resources,
                    include_dashboard=False,
                    log_to_driver=False,
                    namespace="repro",
                    _system_config=LOCAL_SYSTEM_CONFIG,
                )
            return
        except Exception as err:  # Ray raises many types here; the user needs the one line
            # a start that timed out leaves its raylet's agents running: end what this attempt started
            end_processes([p for p in local_ray_processes() if p["pid"] not in before], grace_s=2.0)
            # Ray gives its raylet a fixed 30 s to register; on a loaded machine one more try usually does it
            if attempt == 2 or "timed out during startup" not in str(err):
                raise ClusterError(f"cluster.ray_address: null: could not start a local Ray instance: {err}") from err


def _start_small_node(resources: dict) -> bool:
    """Start a head node without the autoscaler's monitor and the log monitor and connect to it, as ``ray.init``
    starts its own but with those two switched off (``ray.init`` has no argument for them); False, having started
    nothing, where this Ray's private node API is not the one this was written against (then ``ray.init``)."""
    global _local_node
    import ray

    try:
        from ray._private.authentication.authentication_token_setup import (
            enable_token_auth_by_default, ensure_token_if_auth_enabled,
        )
        from ray._private.node import Node
        from ray._private.parameter import RayParams

        params = RayParams(**resources, include_dashboard=False, include_log_monitor=False, no_monitor=True,
                           _system_config=dict(LOCAL_SYSTEM_CONFIG))
    except (ImportError, TypeError):
        return False
    enable_token_auth_by_default()
    ensure_token_if_auth_enabled(params._system_config, create_token_if_missing=True)
    node = Node(params, head=True, shutdown_at_exit=True, spawn_reaper=True)
    try:
        ray.init(address=node.address, log_to_driver=False, namespace="repro", logging_level="warning")
    except BaseException:
        node.kill_all_processes(check_alive=False, allow_graceful=True)
        raise
    _local_node = node
    return True


def _join(address: str) -> None:
    import ray

    if address != "auto":
        _probe(address)
    try:
        ray.init(address=address, log_to_driver=False, namespace="repro", logging_level="warning")
    except Exception as err:
        hint = ""
        if "auth" in str(err).lower() or "token" in str(err).lower():
            hint = " (token auth: set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH as on the cluster)"
        raise ClusterError(f"cluster.ray_address: could not join the Ray cluster at {address!r}: {err}{hint}") from err


def _probe(address: str) -> None:
    """Fail in seconds on an unreachable GCS: ray.init retries a dead address for minutes."""
    bare = address.removeprefix("ray://").removeprefix("http://")
    host, _, port = bare.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"cluster.ray_address: {address!r} is not 'auto', null, or host:port")
    try:
        socket.create_connection((host, int(port)), timeout=JOIN_PROBE_TIMEOUT_S).close()
    except OSError as err:
        raise ClusterError(
            f"cluster.ray_address: could not join the Ray cluster at {address!r}: nothing answers there ({err}); "
            "is `ray start --head` running on that node?"
        ) from None


def _describe(started_local: bool, connect_s: float) -> RayInfo:
    import ray

    resources = ray.cluster_resources()
    address = ray.get_runtime_context().gcs_address
    return RayInfo(address, started_local, resources.get("CPU", 0.0), resources.get("GPU", 0.0), connect_s)


# -- processes of a local instance ------------------------------------------------------------------------------
# A driver killed with SIGKILL runs no clean-up: Ray's agents (DashboardAgent, RuntimeEnvAgent, ~250 MB) may outlive
# it for minutes. A run records the processes of the local instance it started, and the next run ends those that
# are still alive -- matched by process id *and* start time, so a recycled pid is never touched.

def local_ray_processes() -> list[dict]:
    """The Ray processes this driver started (its descendants whose command line runs Ray)."""
    import psutil

    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            command = " ".join(proc.cmdline())
            if "ray" in command:
                found.append({"pid": proc.pid, "create_time": proc.create_time(), "name": proc.name()})
        except psutil.Error:
            continue
    return found


def record_local_processes(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"driver": os.getpid(), "processes": local_ray_processes()}, indent=1))
    tmp.replace(path)


def end_processes(processes: list[dict], grace_s: float = 5.0) -> list[str]:
    """Terminate (then kill) each recorded process still alive with its recorded start time; what was ended."""
    import psutil

    alive, ended = [], []
    for entry in processes:
        try:
            proc = psutil.Process(entry["pid"])
            if abs(proc.create_time() - entry["create_time"]) < 1e-3:
                ended.append(f"{proc.pid} ({proc.name()})")
                proc.terminate()
                alive.append(proc)
        except psutil.Error:
            continue
    _, still = psutil.wait_procs(alive, timeout=grace_s)
    for proc in still:
        try:
            proc.kill()
        except psutil.Error:
            pass
    return ended


def end_recorded_processes(path: Path) -> list[str]:
    """End what a killed run's record lists (nothing else), then drop the record."""
    if not path.is_file():
        return []
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        path.unlink(missing_ok=True)
        return []
    ended = end_processes(record.get("processes", []))
    path.unlink(missing_ok=True)
    return ended
