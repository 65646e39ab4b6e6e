"""What ``repro check`` works with: the gathered facts (``Facts``, filled by ``repro.readiness.facts``), a check's
result and its four verdicts. The checks (``checks``, ``versions``), the gathering (``facts``) and the
report (``report``) all build on this module and on nothing of each other's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
CPU_MODE_SKIP = "CPU mode: the tiny recipe needs no accelerator"

# Environment variables RCCL/NCCL read for the network; reported as found, some checked.
NCCL_VARS = (
    "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "NCCL_IB_GID_INDEX", "NCCL_NET_GDR_LEVEL", "NCCL_IB_DISABLE",
    "NCCL_DEBUG", "NCCL_CROSS_NIC", "GLOO_SOCKET_IFNAME", "RCCL_MSCCL_ENABLE", "HSA_FORCE_FINE_GRAIN_PCIE",
)


@dataclass
class NodeFacts:
    node_id: str
    ip: str
    gpus: float
    cpus: float
    accelerator_type: str | None = None  # Ray's accelerator_type:* resource (e.g. "AMD-Instinct-MI300X-OAM")


@dataclass
class Facts:
    """What ``gather_facts`` found. None means "could not be determined here"."""

    ray_address: str | None = None  # the address tried ('auto', host:port, or None for a local instance)
    ray_reachable: bool = False
    ray_error: str | None = None
    ray_started_local: bool = False
    nodes: list[NodeFacts] = field(default_factory=list)
    accelerator: str = "none"  # "rocm", "cuda" or "none": what torch on this host sees
    device_count: int = 0
    device_name: str | None = None
    arch: str | None = None  # "gfx942", "gfx950", "sm_90", ...
    arch_source: str | None = None  # where arch came from (torch, rocminfo, amd-smi)
    versions: dict[str, str | None] = field(default_factory=dict)  # python, torch, rocm, vllm, ray, transformers, ...
    rdma_devices: list[str] = field(default_factory=list)
    rdma_source: str | None = None  # "/sys/class/infiniband", "ibv_devices" or None (neither present)
    nccl_env: dict[str, str] = field(default_factory=dict)
    disk_path: str = "."
    disk_free_bytes: int | None = None
    host_ram_bytes: int | None = None
    device_memory_bytes: int | None = None  # memory of this node's first accelerator (torch's total_memory)
    shm_total_bytes: int | None = None
    shm_free_bytes: int | None = None
    ray_local_deferred: bool = False  # ray_address null: not started by the check (the run starts its own)
    ray_version: str | None = None
    model_staged: bool = False  # model.path already exists (so it already occupies /dev/shm if it lives there)
    lumenrl_path: str | None = None  # where `import lumenrl` would load from (None: not importable)
    lumenrl_commit: str | None = None  # its git commit, or the one the image recorded (/workspace/SOURCE_VERSIONS)
    # the BF16 trainer's GEMM path on this CPU (repro.train.bf16_gemm.cpu_bf16_facts, plus "gflops": the measured
    # rates of both paths, or "error"); empty where not gathered (a GPU recipe)
    cpu_bf16: dict = field(default_factory=dict)

    @property
    def total_gpus(self) -> float:
        return sum(n.gpus for n in self.nodes)

    @property
    def total_cpus(self) -> float:
        return sum(n.cpus for n in self.nodes)


@dataclass(frozen=True)
class CheckResult:
    check: str
    status: str
    detail: str
    fix: str = ""


Check = Callable[["Recipe", Facts], CheckResult]


def cpu_mode(recipe: "Recipe") -> bool:
    return recipe.cluster.gpus_per_node == 0


def kind_name(accelerator: str) -> str:
    return {"rocm": "ROCm", "cuda": "CUDA", "cpu": "CPU", "none": "no"}.get(accelerator, accelerator)


def skipped(name: str, why: str = CPU_MODE_SKIP) -> CheckResult:
    return CheckResult(name, SKIP, why)
