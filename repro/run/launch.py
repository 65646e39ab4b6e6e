"""`repro launch`: place the recipe's groups on the Ray cluster, show each worker's arguments, start the run.

Megatron's rank layout, as megatron-core's ``parallel_state.initialize_model_parallel`` builds it with its
default ``order="tp-cp-ep-dp-pp"`` (``RankGenerator``): the first name varies fastest. Two generators share
the world:

- dense / attention layers: ``RankGenerator(tp=TP, cp=CP, ep=1, dp=DP, pp=PP)``, DP = world / (TP*CP*PP), so
  ``rank = tp + TP*(cp + CP*(dp + DP*pp))``;
- MoE expert layers: ``RankGenerator(tp=ETP, cp=1, ep=EP, dp=EDP, pp=PP)``, EDP = world / (ETP*EP*PP), so
  ``rank = etp + ETP*(ep + EP*(edp + EDP*pp))``.

Both end in ``pp``, so the pipeline groups agree (megatron asserts it). With AMD's TP4/PP4/EP4/ETP1 on 16
ranks: DP = EDP = 1, ``tp = ep = rank % 4`` and ``pp = rank // 4``, so each TP (and EP) group is 4
consecutive ranks and never crosses the 8-GPU node boundary; pipeline stages 0-1 sit on the first trainer
node and 2-3 on the second.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from repro.cluster import ClusterError
from repro.cluster.placement import (
    ROLLOUT, TRAINER, PlacementPlan, PlacementRow, create_placement_groups, placement_table, plan_placement,
)
from repro.cluster.runtime import ensure_ray, shutdown_ray
from repro.readiness.memory_budget import format_budget, memory_budget
from repro.recipes.backends import MEGATRON_CORE, VLLM, libraries, rollout_of, trainer_of

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe

# What the workers import besides this package is each backend's ``library`` (repro.recipes.backends; the cluster
# image must have them; `make test-megatron` and `make test-vllm` build CPU environments with the pinned versions).
MASTER_PORT = 29500


class LaunchError(ClusterError):
    """The run cannot be launched as the recipe asks (a backend is missing, the layout does not divide)."""


@dataclass(frozen=True)
class RankCoords:
    rank: int
    tp: int
    cp: int
    dp: int
    pp: int
    etp: int  # expert-tensor-parallel rank (MoE layers)
    ep: int  # expert-parallel rank
    edp: int  # expert-data-parallel rank


@dataclass(frozen=True)
class ParallelSizes:
    world: int
    tp: int
    pp: int
    cp: int
    dp: int
    ep: int
    etp: int
    edp: int


def parallel_sizes(world: int, tp: int, pp: int, ep: int = 1, etp: int | None = None, cp: int = 1) -> ParallelSizes:
    """The group sizes megatron-core derives (``etp=None`` means ETP = TP, megatron's default)."""
    etp = tp if etp is None else etp
    for label, size in (("tensor_parallel * context_parallel * pipeline_parallel", tp * cp * pp),
                        ("expert_tensor_parallel * expert_parallel * pipeline_parallel", etp * ep * pp)):
        if size < 1 or world % size:
            raise LaunchError(f"{world} trainer ranks are not divisible by {label} = {size}")
    return ParallelSizes(world, tp, pp, cp, world // (tp * cp * pp), ep, etp, world // (etp * ep * pp))


def megatron_coords(rank: int, sizes: ParallelSizes) -> RankCoords:
    """Rank -> its coordinates, megatron-core's default order tp-cp-ep-dp-pp (first varies fastest)."""
    if not 0 <= rank < sizes.world:
        raise LaunchError(f"rank {rank} outside 0..{sizes.world - 1}")

    def split(index: int, dims: list[int]) -> list[int]:
        out = []
        for size in dims:
            out.append(index % size)
            index //= size
        return out

    tp, cp, dp, pp = split(rank, [sizes.tp, sizes.cp, sizes.dp, sizes.pp])
    etp, ep, edp, epp = split(rank, [sizes.etp, sizes.ep, sizes.edp, sizes.pp])
    assert epp == pp  # both generators end in pp
    return RankCoords(rank, tp, cp, dp, pp, etp, ep, edp)


def recipe_sizes(recipe: "Recipe") -> ParallelSizes:
    actor = recipe.actor
    return parallel_sizes(actor.num_workers, actor.tensor_parallel, actor.pipeline_parallel,
                          actor.expert_parallel, actor.expert_tensor_parallel)


def trainer_worker_args(recipe: "Recipe", master_addr: str = "<node of trainer rank 0>") -> list[dict[str, Any]]:
    """Each trainer rank's torch.distributed identity and Megatron coordinates (its environment on start)."""
    sizes = recipe_sizes(recipe)
    per_node = recipe.actor.num_workers // recipe.actor.nodes
    return [{**asdict(megatron_coords(rank, sizes)), "world_size": sizes.world, "local_rank": rank % per_node,
             "trainer_node": rank // per_node, "master_addr": master_addr, "master_port": MASTER_PORT}
            for rank in range(sizes.world)]


def backend_arguments(recipe: "Recipe") -> dict[str, dict[str, Any]]:
    """What the workers are built with, from the same functions that build them: the Megatron trainer's
    ``megatron_layout`` sections (``repro.train.megatron.config``) when the trainer is Megatron, vLLM's ``LLM``
    arguments (``repro.rollout.vllm_args.engine_args_from_recipe``) and one training rollout's
    ``SamplingParams`` when the rollout is vLLM."""
    sections: dict[str, dict[str, Any]] = {}
    if trainer_of(recipe).library is MEGATRON_CORE:
        from repro.train.megatron.config import megatron_layout  # torch: only for the backends the recipe names

        for name, values in megatron_layout(recipe).items():
            sections[f"megatron {name}"] = values
    if rollout_of(recipe).library is VLLM:
        from repro.rollout.types import SamplingParams
        from repro.rollout.vllm_args import engine_args_from_recipe, vllm_sampling_kwargs

        sections["vllm.LLM"] = engine_args_from_recipe(recipe, recipe.model.path)
        r = recipe.rollout
        train = SamplingParams(n=recipe.algorithm.responses_per_prompt, temperature=r.temperature, top_p=r.top_p,
                               top_k=r.top_k, max_new_tokens=recipe.lengths.max_response, seed=recipe.seed)
        sections["vllm.SamplingParams (one training prompt)"] = vllm_sampling_kwargs(
            train, eos_id="<tokenizer eos>", max_tokens=recipe.lengths.max_response, seed=train.seed)
    return sections


def format_arguments(sections: dict[str, dict[str, Any]]) -> list[str]:
    """One line per argument, ``  name = repr(value)``, under a header per section."""
    lines = []
    for title, values in sections.items():
        lines += ["", f"{title}:"] + [f"  {key} = {value!r}" for key, value in values.items()]
    return lines


def module_available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # "a.b" whose parent package "a" is absent
        return False


def missing_backends(recipe: "Recipe") -> list[str]:
    """Backends the recipe names whose library is not importable here (empty for the embedded CPU backends)."""
    return [f"{lib.what} (pin: repro/readiness/pins.py) (module {lib.module})" for lib in libraries(recipe)
            if not module_available(lib.module)]


def launch_blockers(recipe: "Recipe") -> list[str]:
    """Why the run cannot start from here, each naming what to install or set; empty when it can."""
    blockers = [f"missing {m}" for m in missing_backends(recipe)]
    if trainer_of(recipe).needs_model_provider and not recipe.actor.model_provider:
        blockers.append(
            "actor.model_provider is not set: megatron-core has no DeepSeek-V4 layers, so the trainer ranks need a "
            "'module:function' that builds one (LumenRL's Megatron fork provides it: docs/megatron-dsv4.md)")
    if recipe.rollout.num_replicas != 1:
        blockers.append(f"rollout.num_replicas={recipe.rollout.num_replicas}: one rollout replica is started")
    return blockers


# -- the dry run ---------------------------------------------------------------------------------------------
def unplaced_rows(plan: PlacementPlan) -> list[PlacementRow]:
    """The plan's bundles with no node yet (when there is no cluster to place them on)."""
    return [PlacementRow(g.name, i, "(not placed)", "-", dict(b)) for g in plan.groups for i, b in enumerate(g.bundles)]


def format_dry_run(recipe: "Recipe", plan: PlacementPlan, rows: list[PlacementRow]) -> str:
    """Which node hosts each worker and bundle, each trainer rank's Megatron coordinates, the vLLM arguments, and
    the trainer's memory budget per rank."""
    sizes = recipe_sizes(recipe)
    by_group = {g.name: g for g in plan.groups}
    node_letters: dict[str, str] = {}
    for row in rows:  # name nodes A, B, C... in first-use order, beside their id
        if row.node_id not in node_letters and row.node_id != "(not placed)":
            node_letters[row.node_id] = chr(ord("A") + len(node_letters))
    trainer_rows = [r for r in rows if r.group == TRAINER]
    master = trainer_rows[0].node_ip if trainer_rows and trainer_rows[0].node_ip != "-" else "<node of rank 0>"
    args = trainer_worker_args(recipe, master)
    lines = [
        f"dry run of {recipe.name}: {len(trainer_rows)} trainer worker(s), "
        f"{sum(r.group == ROLLOUT for r in rows)} rollout replica(s); nothing is started",
        f"trainer layout: world {sizes.world} = TP {sizes.tp} x CP {sizes.cp} x DP {sizes.dp} x PP {sizes.pp}; "
        f"experts: ETP {sizes.etp} x EP {sizes.ep} x EDP {sizes.edp} x PP {sizes.pp} "
        "(megatron-core order tp-cp-ep-dp-pp)",
        "",
        f"{'worker':<18} {'slice':>5} {'bundle':>6}  {'node':<16} {'ip':<15} {'resources':<16} "
        f"{'rank':>4} {'local':>5} {'tp':>3} {'cp':>3} {'dp':>3} {'pp':>3} {'ep':>3} {'etp':>3} {'edp':>3}",
    ]
    for row in rows:
        group = by_group[row.group]
        slice_index, bundle = divmod(row.bundle_index, group.bundles_per_slice)
        node = (f"{node_letters.get(row.node_id, '-')} {row.node_id[:12]}" if row.node_id in node_letters
                else row.node_id)
        resources = ", ".join(f"{k} {v:g}" for k, v in sorted(row.resources.items(), key=lambda kv: kv[0] != "GPU"))
        head = (f"{row.group + ' worker ' + str(row.bundle_index):<18} {slice_index:>5} {bundle:>6}  {node:<16} "
                f"{row.node_ip:<15} {resources:<16}")
        if row.group == TRAINER:
            a = args[row.bundle_index]
            head += (f" {a['rank']:>4} {a['local_rank']:>5} {a['tp']:>3} {a['cp']:>3} {a['dp']:>3} {a['pp']:>3} "
                     f"{a['ep']:>3} {a['etp']:>3} {a['edp']:>3}")
        else:
            head += "  vLLM engine, arguments below"
        lines.append(head)
    lines += ["", f"every trainer rank: world_size {sizes.world}, MASTER_ADDR {master}, MASTER_PORT {MASTER_PORT}"]
    lines += format_arguments(backend_arguments(recipe))
    lines.append(format_memory_budget(recipe))
    return "\n".join(lines)


def format_memory_budget(recipe: "Recipe") -> str:
    """Each trainer rank's memory against the recipe's device and host capacities (repro.readiness.memory_budget)."""
    return format_budget(recipe, memory_budget(recipe))


def dry_run(recipe: "Recipe", timeout_s: float = 120.0) -> tuple[str, list[PlacementRow]]:
    """Place both groups on the recipe's cluster, describe every worker, release the placement; start nothing.

    Returns the printed text and the placement rows. Ray is left as found: a connection made here is closed.
    """
    import ray

    plan = plan_placement(recipe)
    recipe_sizes(recipe)  # a layout that does not divide fails before Ray is touched
    connected_before = ray.is_initialized()
    try:
        ensure_ray(recipe)
        placed = create_placement_groups(plan, timeout_s=timeout_s)
        try:
            rows = placement_table(placed)
        finally:
            placed.remove()
    finally:
        if not connected_before:
            shutdown_ray()
    return format_dry_run(recipe, plan, rows), rows


def simulated_dry_run(recipe: "Recipe", timeout_s: float = 120.0) -> str:
    """The dry run on a cluster of the recipe's shape simulated on this machine (``ray.cluster_utils.Cluster``:
    ``cluster.num_nodes`` Ray nodes, each offering ``gpus_per_node`` *logical* GPUs), so which node would host
    which worker can be seen anywhere. Nothing touches a real GPU; the cluster is shut down afterwards."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        raise LaunchError("a simulated dry run needs this process free of any Ray connection")
    plan = plan_placement(recipe)
    # each simulated node offers what the busiest node must hold (the trainer's ranks per node), no more: Ray
    # starts processes per CPU it is told of
    cpus = max(1, max(int(sum(b.get("CPU", 0) for b in g.bundles) // max(g.nodes, 1)) for g in plan.groups))
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    node = {"num_cpus": cpus, "num_gpus": recipe.cluster.gpus_per_node, "include_log_monitor": False}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False, "no_monitor": True})
    try:
        for _ in range(recipe.cluster.num_nodes - 1):
            cluster.add_node(**node)
        simulated = recipe.model_copy(
            update={"cluster": recipe.cluster.model_copy(update={"ray_address": cluster.address})})
        text, _ = dry_run(simulated, timeout_s=timeout_s)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
    banner = (f"SIMULATED: no Ray cluster was used. {recipe.cluster.num_nodes} Ray nodes x "
              f"{recipe.cluster.gpus_per_node} logical GPUs were started on this machine to show the placement; "
              "node letters and addresses below are the simulation's, not your servers'.")
    return banner + "\n" + text
