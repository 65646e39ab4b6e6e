"""`repro check`: is this machine (or Ray cluster) ready for a recipe? Pure checks over gathered facts.

Each check is a function ``(recipe, facts) -> CheckResult`` that reads only its arguments, so every PASS /
WARN / FAIL / SKIP can be tested with hand-made ``Facts``. ``repro.readiness.facts.gather_facts`` collects the
facts on the real machine (Ray, torch, rocminfo/amd-smi, /sys/class/infiniband, the environment, disks);
``check_cluster`` does both. In CPU mode (``cluster.gpus_per_node: 0``, the tiny recipe) the accelerator
checks say SKIP instead of failing: nothing there needs a GPU.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from repro.cluster.placement import plan_placement
from repro.cluster.runtime import LOCAL_OBJECT_STORE_BYTES
from repro.readiness.facts import gather_facts
from repro.readiness.memory_budget import checkpoint_bytes, memory_budget, optimizer_bytes
# how results are shown and saved (report), the gathered facts and the verdicts (types) and the
# version rows (versions) are re-exported: `repro check`, notebook 00 and the tests read them here
from repro.readiness.report import failed, format_table, results_as_dicts, summary_line, write_json  # noqa: F401
from repro.readiness.types import (  # noqa: F401
    CPU_MODE_SKIP, FAIL, NCCL_VARS, PASS, SKIP, WARN, Check, CheckResult, Facts, NodeFacts, cpu_mode, kind_name,
    skipped,
)
from repro.readiness.versions import (  # noqa: F401
    VERSION_CHECKS, check_lumenrl, check_megatron, check_platform, check_python, check_ray_version, check_torch,
    check_transformer_engine, check_transformers, check_vllm,
)

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe

# FP8 encodings by architecture: MI300-class (gfx942, incl. MI308X) computes in e4m3fnuz (max 240);
# MI350-class (gfx950) and NVIDIA (Hopper/Blackwell) in OCP e4m3fn (max 448).
FNUZ_ARCHS = ("gfx940", "gfx941", "gfx942")
RAM_WARN_FRACTION = 0.8  # above this share of host RAM the offloaded optimizer leaves too little for the rest
DISK_WARN_MARGIN = 1.1


def expected_gpus(recipe: "Recipe") -> int:
    return recipe.cluster.num_nodes * recipe.cluster.gpus_per_node


def fp8_format_for(accelerator: str, arch: str | None) -> str | None:
    """The FP8 encoding the hardware computes in; None when the architecture is unknown."""
    if accelerator == "cuda":
        return "e4m3fn"
    if accelerator == "rocm" and arch:
        return "e4m3fnuz" if arch.split(":")[0] in FNUZ_ARCHS else "e4m3fn"
    return None


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB"


# -- the checks ------------------------------------------------------------------------------------------
def check_ray(recipe: "Recipe", facts: Facts) -> CheckResult:
    where = ("a local instance" if recipe.cluster.ray_address is None
             else f"cluster.ray_address={recipe.cluster.ray_address!r}")
    if not facts.ray_reachable:
        if recipe.cluster.ray_address is None:
            fix = "see the error; `ray start --head` by hand shows Ray's own log"
        else:
            fix = ("start Ray on every node (`ray start --head` on the first, `ray start --address=<head-ip>:6379` "
                   "on the others) and run this on a node of that cluster, or set cluster.ray_address to the head's "
                   "host:port")
        return CheckResult("ray", FAIL, f"Ray not reachable via {where}: {facts.ray_error or 'unknown error'}", fix)
    mode = " (CPU mode)" if cpu_mode(recipe) else ""
    if facts.ray_local_deferred:
        return CheckResult("ray", PASS, f"ray {facts.ray_version} installed; cluster.ray_address is null, so the run "
                                        "starts its own local instance (not started by this check; --start-ray does): "
                                        f"this host offers {facts.total_cpus:g} CPUs, {facts.total_gpus:g} GPUs{mode}")
    how = "started a local instance" if facts.ray_started_local else f"joined {facts.ray_address}"
    return CheckResult("ray", PASS, f"{how}: {len(facts.nodes)} node(s), {facts.total_cpus:g} CPUs, "
                                    f"{facts.total_gpus:g} GPUs{mode}")


def check_gpu_count(recipe: "Recipe", facts: Facts) -> CheckResult:
    if cpu_mode(recipe):
        return skipped("gpu_count")
    need = expected_gpus(recipe)
    if not facts.ray_reachable:
        return CheckResult("gpu_count", FAIL, f"0 of {need} GPUs: Ray is not reachable, so no GPU is visible to the "
                                              f"run (`ray status` should report {need} GPUs)",
                           "fix the ray check first")
    have = facts.total_gpus
    if have < need:
        return CheckResult("gpu_count", FAIL,
                           f"Ray reports {have:g} GPUs, the recipe needs {need} "
                           f"({recipe.cluster.num_nodes} nodes x {recipe.cluster.gpus_per_node})",
                           "join the missing nodes (`ray start --address=<head-ip>:6379 --num-gpus=8`) or check that "
                           "each node's GPUs are visible (HIP_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES unset)")
    if have > need:
        return CheckResult("gpu_count", WARN,
                           f"Ray reports {have:g} GPUs, the recipe uses {need}: {have - need:g} stay idle",
                           "nothing to fix unless other jobs need them")
    return CheckResult("gpu_count", PASS,
                       f"Ray reports {have:g} GPUs = {recipe.cluster.num_nodes} x {recipe.cluster.gpus_per_node}")


def check_nodes(recipe: "Recipe", facts: Facts) -> CheckResult:
    if not facts.ray_reachable:
        return CheckResult("nodes", FAIL, "no nodes: Ray is not reachable", "fix the ray check first")
    if cpu_mode(recipe):
        need = sum(b.get("CPU", 0) for g in plan_placement(recipe).groups for b in g.bundles)
        if facts.total_cpus < need:
            return CheckResult("nodes", FAIL, f"Ray offers {facts.total_cpus:g} CPUs, the plan needs {need:g}",
                               "free CPUs or start Ray with more --num-cpus")
        return CheckResult("nodes", PASS, f"CPU mode: {len(facts.nodes)} node(s), {facts.total_cpus:g} CPUs "
                                          f"for {need:g} one-CPU workers")
    per_node = recipe.cluster.gpus_per_node
    full = [n for n in facts.nodes if n.gpus >= per_node]
    layout = ", ".join(f"{n.ip}: {n.gpus:g} GPU" for n in facts.nodes) or "none"
    if len(full) < recipe.cluster.num_nodes:
        return CheckResult("nodes", FAIL,
                           f"{len(full)} node(s) with >= {per_node} GPUs, the recipe needs {recipe.cluster.num_nodes} "
                           f"(trainer on {recipe.actor.nodes}, rollout on the rest); nodes: {layout}",
                           "every node must offer all its GPUs to Ray: the trainer packs 8 ranks per node and the "
                           "TP8 rollout needs a whole node")
    return CheckResult("nodes", PASS, f"{len(full)} node(s) with >= {per_node} GPUs each: {layout}")


def check_accelerator(recipe: "Recipe", facts: Facts) -> CheckResult:
    if cpu_mode(recipe):
        return skipped("accelerator")
    want = recipe.cluster.accelerator
    seen = f"{facts.device_count} x {facts.device_name or '?'} ({facts.arch or 'arch unknown'})"
    if facts.accelerator == "none":
        return CheckResult("accelerator", FAIL, f"no {kind_name(want)} GPU visible to torch on this host "
                                                 f"(torch {facts.versions.get('torch') or '?'})",
                           f"run on a node of the cluster with the {kind_name(want)} build of torch"
                           + (f" {recipe.cluster.versions.torch}" if recipe.cluster.versions.torch else ""))
    if facts.accelerator != want:
        return CheckResult("accelerator", FAIL,
                           f"torch sees {kind_name(facts.accelerator)} GPUs ({seen}), "
                           f"the recipe expects {kind_name(want)}",
                           f"set cluster.accelerator: {facts.accelerator} if this is intended, "
                           f"or run on the {kind_name(want)} cluster")
    if want == "rocm" and facts.arch and not facts.arch.startswith("gfx942"):
        return CheckResult("accelerator", WARN, f"{seen}: AMD's run used MI308X (gfx942)",
                           "fine to run; throughput and FP8 encoding differ from AMD's numbers")
    return CheckResult("accelerator", PASS, f"{seen}, arch from {facts.arch_source or '?'}")


def check_fp8_format(recipe: "Recipe", facts: Facts) -> CheckResult:
    configured = recipe.rollout.fp8_format
    if recipe.rollout.weight_format != "fp8_block":
        return CheckResult("fp8_format", SKIP, "rollout.weight_format is bf16: no FP8 weights")
    if cpu_mode(recipe):
        return CheckResult("fp8_format", SKIP, f"{CPU_MODE_SKIP}; FP8 is emulated in software as "
                                               f"rollout.fp8_format={configured}")
    hardware = fp8_format_for(facts.accelerator, facts.arch)
    if hardware is None and facts.accelerator == "none":
        return CheckResult("fp8_format", FAIL, "no GPU here to read the FP8 encoding from (MI308X, gfx942: e4m3fnuz; "
                                               f"gfx950/NVIDIA: e4m3fn); rollout.fp8_format={configured}",
                           "run repro check on a node of the cluster")
    if hardware is None:
        return CheckResult("fp8_format", WARN,
                           f"cannot tell the FP8 encoding: {kind_name(facts.accelerator)} GPU, arch unknown",
                           "install rocminfo or amd-smi (ROCm) so the architecture can be read, then rerun")
    if configured == "auto":
        return CheckResult("fp8_format", PASS,
                           f"{facts.arch or facts.accelerator} -> {hardware}; rollout.fp8_format: auto picks it")
    if configured != hardware:
        return CheckResult("fp8_format", FAIL,
                           f"rollout.fp8_format={configured} but {facts.arch or facts.accelerator} "
                           f"computes in {hardware}",
                           f"set rollout.fp8_format: auto (or {hardware})")
    return CheckResult("fp8_format", PASS, f"{facts.arch or facts.accelerator} -> {hardware} = rollout.fp8_format")


def check_rdma(recipe: "Recipe", facts: Facts) -> CheckResult:
    if cpu_mode(recipe):
        return skipped("rdma")
    if facts.rdma_devices:
        return CheckResult("rdma", PASS, f"{len(facts.rdma_devices)} RDMA device(s) from {facts.rdma_source}: "
                                         f"{', '.join(facts.rdma_devices)}")
    multi = recipe.cluster.num_nodes > 1
    return CheckResult("rdma", WARN if multi else PASS,
                       "no RDMA device (/sys/class/infiniband absent or empty, no ibv_devices): RCCL falls back to "
                       f"TCP sockets{' for the cross-node pipeline stages and the weight sync' if multi else ''}",
                       "load the NIC drivers (e.g. `ls /sys/class/infiniband` should list the RoCE/IB devices)"
                       if multi else "")


def check_nccl_env(recipe: "Recipe", facts: Facts) -> CheckResult:
    if cpu_mode(recipe):
        return skipped("nccl_env")
    shown = ", ".join(f"{k}={v}" for k, v in sorted(facts.nccl_env.items())) or "none set"
    hca = facts.nccl_env.get("NCCL_IB_HCA")
    if hca and facts.rdma_devices:
        names = [part.split(":")[0].lstrip("=^") for part in hca.split(",") if part.strip()]
        unknown = [n for n in names if not any(d.startswith(n) for d in facts.rdma_devices)]
        if unknown:
            return CheckResult("nccl_env", FAIL, f"NCCL_IB_HCA names {', '.join(unknown)}, not among the RDMA devices "
                                                 f"{', '.join(facts.rdma_devices)}",
                               "set NCCL_IB_HCA to devices listed in /sys/class/infiniband")
    missing = []
    if facts.rdma_devices and not hca:
        missing.append(f"NCCL_IB_HCA (e.g. {','.join(facts.rdma_devices)})")
    if recipe.cluster.num_nodes > 1 and "NCCL_SOCKET_IFNAME" not in facts.nccl_env:
        missing.append("NCCL_SOCKET_IFNAME (the interface carrying the node IPs)")
    if missing:
        return CheckResult("nccl_env", WARN, f"RCCL/NCCL variables: {shown}; unset: {'; '.join(missing)}",
                           "export them on every node before `ray start` so Ray workers inherit them")
    return CheckResult("nccl_env", PASS, f"RCCL/NCCL variables: {shown}")


def check_disk(recipe: "Recipe", facts: Facts) -> CheckResult:
    each = checkpoint_bytes(recipe)
    need = each * (recipe.checkpoint.keep_last + 1)
    what = (f"checkpoints need ~{_gb(need)} ({recipe.checkpoint.keep_last} kept + 1 being written, {_gb(each)} each: "
            f"weights + fp32 master + Adam moments)")
    if facts.disk_free_bytes is None:
        return CheckResult("disk", WARN, f"free space at {facts.disk_path} unknown; {what}", "check `df -h` by hand")
    free = facts.disk_free_bytes
    if free < need:
        return CheckResult("disk", FAIL, f"{_gb(free)} free at {facts.disk_path}; {what}",
                           "pass --run-dir on a larger (shared) filesystem or lower checkpoint.keep_last")
    if free < need * DISK_WARN_MARGIN:
        return CheckResult("disk", WARN, f"{_gb(free)} free at {facts.disk_path}, barely enough; {what}",
                           "leave room for logs and eval outputs")
    return CheckResult("disk", PASS, f"{_gb(free)} free at {facts.disk_path}; {what}")


def optimizer_bytes_per_node(recipe: "Recipe") -> int:
    """Host RAM the busiest trainer node needs for its ranks' CPU-offloaded optimizer state: the number
    `repro launch --dry-run` prints (``repro.readiness.memory_budget``)."""
    return max(memory_budget(recipe).node_host)


def check_host_ram(recipe: "Recipe", facts: Facts) -> CheckResult:
    if cpu_mode(recipe):
        need, what = (checkpoint_bytes(recipe),
                      "for the trainer's weights and optimizer state (CPU mode: they live in host RAM)")
    elif recipe.actor.optimizer_cpu_offload:
        need = optimizer_bytes_per_node(recipe)
        what = (f"on the busiest trainer node for its ranks' CPU-offloaded optimizer state "
                f"({optimizer_bytes(recipe).holder}; `repro launch --dry-run` shows the budget)")
    else:
        return CheckResult("host_ram", SKIP, "actor.optimizer_cpu_offload is off: the optimizer stays on the GPUs")
    if facts.host_ram_bytes is None:
        return CheckResult("host_ram", WARN, f"host RAM unknown; need ~{_gb(need)} {what}",
                           "check `free -g` on each trainer node")
    ram = facts.host_ram_bytes
    detail = f"{_gb(ram)} RAM on this host; need ~{_gb(need)} {what}"
    if need > ram:
        return CheckResult("host_ram", FAIL, detail, "spread the trainer over more nodes (actor.nodes), or turn off "
                                                     "actor.optimizer_cpu_offload if GPU memory allows")
    if need > RAM_WARN_FRACTION * ram:
        return CheckResult("host_ram", WARN, detail + f" (> {RAM_WARN_FRACTION:.0%})",
                           "little room is left for data loading, Ray's object store and the page cache")
    return CheckResult("host_ram", PASS, detail)


def check_device_memory(recipe: "Recipe", facts: Facts) -> CheckResult:
    """The busiest trainer rank's memory budget against this node's accelerator memory (the dry run's numbers)."""
    if cpu_mode(recipe):
        return skipped("device_memory")
    measured = facts.device_memory_bytes
    budget = memory_budget(recipe, device_bytes=measured)
    worst = budget.busiest
    source = "measured on this node" if measured else "cluster.device_memory_gb: no accelerator seen here"
    detail = (f"busiest trainer rank (pipeline stage {worst.stage}) needs ~{_gb(worst.device_total)} of "
              f"{_gb(budget.device_capacity)} per device ({source})")
    device_problems = [p for p in budget.problems if p.startswith("device:")]
    if device_problems:
        return CheckResult("device_memory", FAIL, detail, device_problems[0].split(": ", 1)[1])
    if measured is None:
        return CheckResult("device_memory", WARN, detail, "run `repro check` on a trainer node")
    return CheckResult("device_memory", PASS, detail)


def shm_need_bytes(recipe: "Recipe", model_staged: bool) -> tuple[int, str]:
    """Free /dev/shm the run still needs: two weight-sync buckets, the staged model, Ray's local store."""
    parts: list[tuple[str, int]] = [("2 weight-sync buckets", 2 * recipe.weight_sync.bucket_mb * 1024**2)]
    if recipe.model.path.startswith("/dev/shm") and not model_staged:
        parts.append(("the BF16 model to stage", recipe.model.num_parameters * 2))
    if recipe.cluster.ray_address is None:
        parts.append(("Ray's local object store", LOCAL_OBJECT_STORE_BYTES))
    return sum(n for _, n in parts), " + ".join(f"{label} {_gb(n)}" for label, n in parts)


def check_shm(recipe: "Recipe", facts: Facts) -> CheckResult:
    need, parts = shm_need_bytes(recipe, facts.model_staged)
    if facts.shm_total_bytes is None or facts.shm_free_bytes is None:
        return CheckResult("shm", WARN, f"/dev/shm not found; need ~{_gb(need)} ({parts})",
                           "mount a tmpfs on /dev/shm (docker: --shm-size or --ipc=host)")
    detail = f"/dev/shm {_gb(facts.shm_free_bytes)} free of {_gb(facts.shm_total_bytes)}; need ~{_gb(need)} ({parts})"
    if facts.shm_free_bytes < need:
        return CheckResult("shm", FAIL, detail, "enlarge /dev/shm (docker: --shm-size=... or --ipc=host; "
                                                "`mount -o remount,size=...G /dev/shm`), or stage the model elsewhere")
    return CheckResult("shm", PASS, detail)


# `make repro` on a 2-core machine with the venv present, by the path the BF16 trainer takes: measured figures
# (command and date in docs/performance.md). "native" without oneDNN BF16 is the slow native path of an AVX2 CPU.
EXPECTED_MAKE_REPRO_S = {"native": 145, "fp32": 155, "native without oneDNN BF16": 477}


def check_cpu_bf16(recipe: "Recipe", facts: Facts) -> CheckResult:
    """The BF16 trainer's GEMM path on this CPU (repro.train.bf16_gemm) and what `make repro` should take."""
    from repro.train.bf16_gemm import BF16GemmError, choose_path  # torch: only where the CPU trains

    if not cpu_mode(recipe) or recipe.actor.backend != "embedded" or recipe.actor.dtype != "bf16":
        return skipped("cpu_bf16", "the trainer computes no BF16 GEMM on this CPU (GPU recipe, or actor.dtype fp32)")
    bf16 = facts.cpu_bf16
    if not bf16 or "error" in bf16:
        why = bf16.get("error", "not gathered")
        return CheckResult("cpu_bf16", WARN, f"could not read this CPU's BF16 support: {why}",
                           "run `PYTHONPATH=. python benchmarks/bench_bf16_gemm.py --gemm` to see both paths' speed")
    try:
        path = choose_path(recipe.actor.bf16_gemm, bf16.get("env"), bf16["onednn_bf16"])
    except BF16GemmError as err:
        return CheckResult("cpu_bf16", FAIL, str(err), "the trainer refuses to start like this: see the message")
    cpu = (f"torch capability {bf16['cpu_capability']}, avx512_bf16 {'yes' if bf16['avx512_bf16'] else 'no'}, "
           f"amx {'yes' if bf16['amx'] else 'no'}, oneDNN BF16 {'yes' if bf16['onednn_bf16'] else 'no'}")
    rates = bf16.get("gflops", {})
    measured = ", ".join(f"{name} {rate:.1f}" for name, rate in rates.items())
    why = f"actor.bf16_gemm={recipe.actor.bf16_gemm}" + (f", REPRO_BF16_GEMM={bf16['env']}" if bf16.get("env") else "")
    detail = (f"{cpu}; BF16 GEMMs on the {path} path ({why}); 256^3 GFLOP/s here: {measured or 'not measured'}; "
              f"expected make repro on 2 cores: ~{{}} s")
    if path == "native" and not bf16["onednn_bf16"]:
        return CheckResult("cpu_bf16", WARN, detail.format(EXPECTED_MAKE_REPRO_S["native without oneDNN BF16"]),
                           "torch's BF16 matmul has no fast kernel on this CPU: set actor.bf16_gemm: auto (or fp32)")
    return CheckResult("cpu_bf16", PASS, detail.format(EXPECTED_MAKE_REPRO_S[path]))


def run_checks(recipe: "Recipe", facts: Facts) -> list[CheckResult]:
    return [check(recipe, facts) for check in CHECKS]


def check_cluster(recipe: "Recipe", run_dir: str | os.PathLike | None = None,
                  start_local_ray: bool = False) -> list[CheckResult]:
    """Gather the facts on this machine / the recipe's Ray cluster and run every check."""
    return run_checks(recipe, gather_facts(recipe, run_dir, start_local_ray=start_local_ray))


CHECKS: tuple[Check, ...] = (
    check_ray, check_gpu_count, check_nodes, check_accelerator, check_fp8_format, *VERSION_CHECKS,
    check_rdma, check_nccl_env, check_disk, check_device_memory, check_host_ram, check_shm, check_cpu_bf16,
)
