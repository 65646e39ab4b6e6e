"""Gather the facts ``repro.readiness.checks`` judges: Ray, torch's accelerator, versions, RDMA, env, disks.

Every probe degrades gracefully: a missing tool (rocminfo, amd-smi, ibv_devices), package (vLLM,
megatron-core) or file leaves its fact at None/empty and the check says what could not be read. Nothing
here raises for an absent cluster: an unreachable Ray becomes ``ray_reachable=False`` with the reason.

Facts about the accelerator, software, RDMA, RAM and /dev/shm are this host's (run ``repro check`` on a
node of the cluster; all nodes are installed alike); node and GPU counts are the whole Ray cluster's.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from repro.cluster.runtime import ensure_ray, shutdown_ray
from repro.readiness.types import NCCL_VARS, Facts, NodeFacts

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe

TOOL_TIMEOUT_S = 20
ROCM_VERSION_FILES = ("/opt/rocm/.info/version", "/opt/rocm/.info/version-dev")


def gather_facts(recipe: "Recipe", run_dir: str | os.PathLike | None = None, start_local_ray: bool = False) -> Facts:
    """``start_local_ray``: for ``cluster.ray_address: null`` really start (and stop) a local instance; by
    default it is not started (10-60 s on a busy laptop) since ``repro run`` starts its own."""
    facts = Facts()
    _accelerator_facts(facts)
    if recipe.cluster.ray_address is None and not start_local_ray:
        _deferred_local_ray(facts)
    else:
        _ray_facts(recipe, facts)
    facts.versions.update(_versions())
    facts.lumenrl_path, facts.lumenrl_commit = _lumenrl()
    facts.rdma_devices, facts.rdma_source = _rdma_devices()
    facts.nccl_env = {k: v for k, v in os.environ.items() if k in NCCL_VARS or k.startswith(("NCCL_IB_", "RCCL_"))}
    target = Path(run_dir) if run_dir else Path("runs") / recipe.name
    facts.disk_path, facts.disk_free_bytes = _free_at(target)
    facts.host_ram_bytes = _host_ram()
    facts.shm_total_bytes, facts.shm_free_bytes = _disk_usage("/dev/shm")
    facts.model_staged = not recipe.model.path.startswith("builtin:") and Path(recipe.model.path).exists()
    if recipe.cluster.gpus_per_node == 0:
        facts.cpu_bf16 = _cpu_bf16()
    return facts


def _cpu_bf16() -> dict:
    """This CPU's BF16 GEMM facts and both paths' measured GFLOP/s (~50 ms); a failure is kept as ``error``."""
    from repro.train.bf16_gemm import cpu_bf16_facts, measure_paths  # torch: only where the CPU trains

    try:
        return {**cpu_bf16_facts(), "gflops": measure_paths()}
    except Exception as err:  # a probe must not stop the other checks; the check reports it
        return {"error": f"{type(err).__name__}: {err}"}


# -- Ray ---------------------------------------------------------------------------------------------------
class NoClusterFound(Exception):
    """'auto' found no cluster started with `ray start` on this machine."""


def resolve_address(address: str | None) -> str | None:
    """The address a check should join: ``auto`` means $RAY_ADDRESS, else the cluster `ray start` recorded.

    ray.init("auto") also falls back to *any* Ray process it sees on the machine, e.g. another user's or a
    test's ``ray.init()`` instance: a check must not mistake that for the cluster, so that fallback is not
    taken here. The resolved address is probed (fails in seconds) rather than retried for minutes.
    """
    if address != "auto":
        return address
    env = os.environ.get("RAY_ADDRESS", "")
    if env and env != "auto":
        return env
    try:
        from ray._private.utils import read_ray_address

        recorded = read_ray_address()
    except Exception:
        recorded = None
    if not recorded:
        raise NoClusterFound(
            "no Ray cluster found on this machine: RAY_ADDRESS is unset and no "
            "`ray start` was run here (no ray_current_cluster file); Ray instances started by ray.init() in "
            "other processes are not a cluster and are ignored"
        )
    return recorded


def _ray_facts(recipe: "Recipe", facts: Facts) -> None:
    import ray

    facts.ray_address = recipe.cluster.ray_address
    connected_before = ray.is_initialized()
    try:
        if connected_before:  # a notebook or test already joined: judge that cluster
            info = ensure_ray(recipe)
        else:
            address = resolve_address(recipe.cluster.ray_address)
            facts.ray_address = address
            info = ensure_ray(recipe.model_copy(
                update={"cluster": recipe.cluster.model_copy(update={"ray_address": address})}))
        facts.ray_reachable, facts.ray_started_local = True, info.started_local
        facts.ray_address = info.address
        facts.nodes = [_node(n) for n in ray.nodes() if n.get("Alive")]
    except Exception as err:  # any failure to reach Ray is a fact, not a crash
        facts.ray_error = " ".join(str(err).split())[:400] or type(err).__name__
    finally:
        if not connected_before:
            shutdown_ray()


def _deferred_local_ray(facts: Facts) -> None:
    """This host as the one node a local instance would offer, without starting it."""
    facts.ray_local_deferred = True
    facts.ray_version = _package_version("ray")
    facts.ray_reachable = facts.ray_version is not None
    if not facts.ray_reachable:
        facts.ray_error = "ray is not installed"
        return
    facts.nodes = [NodeFacts("local", "127.0.0.1", float(facts.device_count), float(os.cpu_count() or 1))]


def _node(raw: dict) -> NodeFacts:
    resources = raw.get("Resources", {})
    kinds = [k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:")]
    return NodeFacts(raw.get("NodeID", "?"), raw.get("NodeManagerAddress", "?"), float(resources.get("GPU", 0)),
                     float(resources.get("CPU", 0)), kinds[0] if kinds else None)


# -- accelerator -------------------------------------------------------------------------------------------
def _accelerator_facts(facts: Facts) -> None:
    try:
        import torch
    except Exception:
        return
    hip, cuda = getattr(torch.version, "hip", None), getattr(torch.version, "cuda", None)
    try:
        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
    except Exception:
        available, count = False, 0
    if available and count:
        facts.accelerator = "rocm" if hip else "cuda"
        facts.device_count = count
        props = torch.cuda.get_device_properties(0)
        facts.device_name = props.name
        facts.device_memory_bytes = int(props.total_memory)
        if hip:
            arch = getattr(props, "gcnArchName", "") or ""
            if arch:
                facts.arch, facts.arch_source = arch.split(":")[0], "torch"
        else:
            facts.arch, facts.arch_source = f"sm_{props.major}{props.minor}", "torch"
    if facts.arch is None:  # torch without a GPU build can still sit on an AMD node: ask ROCm's tools
        arch, source = _rocm_arch()
        if arch:
            facts.arch, facts.arch_source = arch, source
            if facts.accelerator == "none" and not hip:
                facts.device_name = f"{arch} (seen by {source}; this torch cannot use it)"


def _rocm_arch() -> tuple[str | None, str | None]:
    for tool, args, pattern in (("rocminfo", [], r"Name:\s+(gfx[0-9a-f]+)"),
                                ("amd-smi", ["static", "--asic"], r"TARGET_GRAPHICS_VERSION:\s*(gfx[0-9a-f]+)")):
        out = _run_tool(tool, args)
        match = re.search(pattern, out or "")
        if match:
            return match.group(1), tool
    return None, None


def _run_tool(tool: str, args: list[str]) -> str | None:
    path = shutil.which(tool)
    if not path:
        return None
    try:
        done = subprocess.run([path, *args], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout


# -- software ----------------------------------------------------------------------------------------------
def _package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"torch": _package_version("torch")}
    try:
        import torch

        found["torch"] = torch.__version__
        found["rocm_torch"] = getattr(torch.version, "hip", None)
        found["cuda_torch"] = getattr(torch.version, "cuda", None)
    except Exception:
        found["rocm_torch"] = found["cuda_torch"] = None
    found["rocm"] = None
    for candidate in ROCM_VERSION_FILES:
        try:
            found["rocm"] = Path(candidate).read_text().strip().split("-")[0] or None
            break
        except OSError:
            continue
    found["vllm"] = _package_version("vllm")
    found["megatron-core"] = _package_version("megatron-core") or _package_version("megatron_core")
    found["transformer-engine"] = _package_version("transformer-engine") or _package_version("transformer_engine")
    found["ray"] = _package_version("ray")
    found["transformers"] = _package_version("transformers")
    found["python"] = platform.python_version()
    return found


# LumenRL's Dockerfile.dsv4 records the commits it built from here ("LumenRL=<sha>" lines).
IMAGE_SOURCE_VERSIONS = Path("/workspace/SOURCE_VERSIONS")


def _lumenrl() -> tuple[str | None, str | None]:
    """Where `import lumenrl` would load from and its commit, without importing it (it pulls in torch, Megatron)."""
    try:
        spec = importlib.util.find_spec("lumenrl")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None, None
    package = Path(next(iter(spec.submodule_search_locations)))
    checkout, commit = package.parent, None
    top = (_run_tool("git", ["-C", str(checkout), "rev-parse", "--show-toplevel"]) or "").strip()
    if top and Path(top).resolve() == checkout.resolve():  # its own checkout, not some repository around site-packages
        commit = (_run_tool("git", ["-C", str(checkout), "rev-parse", "HEAD"]) or "").strip() or None
    if commit is None:
        try:
            records = dict(line.split("=", 1) for line in IMAGE_SOURCE_VERSIONS.read_text().splitlines() if "=" in line)
            commit = records.get("LumenRL", "").strip() or None
        except OSError:
            pass
    return str(checkout), commit


# -- network, memory, disks --------------------------------------------------------------------------------
def _rdma_devices() -> tuple[list[str], str | None]:
    sys_dir = Path("/sys/class/infiniband")
    try:
        names = sorted(p.name for p in sys_dir.iterdir())
    except OSError:
        names = []
    if names:
        return names, str(sys_dir)
    out = _run_tool("ibv_devices", [])
    if out:
        names = [line.split()[0] for line in out.splitlines()[2:] if line.split()]
        if names:
            return names, "ibv_devices"
    return [], None


def _host_ram() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _disk_usage(path: str | os.PathLike) -> tuple[int | None, int | None]:
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return None, None
    return usage.total, usage.free


def _free_at(target: Path) -> tuple[str, int | None]:
    """Free bytes on the filesystem that will hold ``target`` (its nearest existing parent)."""
    probe = target.resolve()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return str(target), _disk_usage(probe)[1]
