"""Where the trainer and rollout groups run: a pure plan, then Ray placement groups that realise it.

The AMD layout is 3 nodes x 8 GPUs: 16 one-GPU trainer workers on exactly two nodes, one TP8 rollout replica
on the third. How it is expressed, and why this way:

- One STRICT_SPREAD group of 16 one-GPU bundles cannot place on 3 nodes, and one PACK group is only a
  preference: when GPUs are busy it silently spills trainer workers onto the rollout's node.
- Custom node resources (``trainer_node: 1``) would be exact but push work onto whoever starts the cluster,
  and a cluster started without them simply never places.
- So each group is cut into per-node *slices*, one STRICT_PACK placement group each (8 trainer bundles per
  node; one rollout replica per slice). STRICT_PACK makes "these 8 share a node" a hard rule. "Different
  nodes" is made hard too, independent of GPU counts: slices are created one after another, each with a
  ``ray.io/node-id`` label selector ``!in(...)`` excluding the nodes already taken by earlier slices of its
  group and by every group it must avoid (the rollout avoids the trainer). On the AMD cluster this is also
  implied by capacity (each slice needs a whole 8-GPU node), but the selector still holds on 16-GPU nodes.
- The rollout replica is one bundle of {GPU: TP}: its engine actor owns all TP GPUs and vLLM starts its own
  TP workers inside it, rather than Ray scheduling 8 actors vLLM would have to find again.

CPU mode (gpus_per_node 0, the tiny recipe) is one local node: one CPU bundle per trainer worker and per
rollout replica, nothing to avoid. ``plan_placement`` imports no Ray so a dry run can print the plan.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from repro.cluster import ClusterError

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup

    from repro.recipes.schema import Recipe

TRAINER, ROLLOUT = "trainer", "rollout"
NODE_ID_LABEL = "ray.io/node-id"
# Logical CPUs per one-GPU trainer worker: Ray sets OMP_NUM_THREADS from it, and the CPU-offloaded Adam and
# the data path run in these threads. 4 x 8 = 32 per node fits any MI308X/H100 server.
CPUS_PER_TRAINER_GPU = 4
# The vLLM replica's API process, scheduler and TP workers all live under the one engine actor.
CPUS_PER_ROLLOUT_REPLICA = 8
CPUS_PER_CPU_WORKER = 1


class PlacementError(ClusterError):
    """A group cannot be placed as the recipe asks."""


@dataclass(frozen=True)
class BundlePlan:
    name: str
    bundles: tuple[dict[str, float], ...]  # one per worker (trainer rank, rollout replica), in order
    strategy: str  # Ray strategy of every slice
    nodes: int  # nodes the group is meant to span (rollout: at most)
    bundles_per_slice: int  # consecutive bundles that form one placement group
    distinct_slice_nodes: bool  # slices must land on pairwise different nodes
    avoid_groups: tuple[str, ...] = ()  # groups whose nodes this group must not touch

    @property
    def slices(self) -> list[tuple[dict[str, float], ...]]:
        k = self.bundles_per_slice
        return [self.bundles[i:i + k] for i in range(0, len(self.bundles), k)]

    def totals(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for bundle in self.bundles:
            for key, amount in bundle.items():
                total[key] = total.get(key, 0) + amount
        return total

    def describe(self) -> str:
        avoid = f", on nodes without {'/'.join(self.avoid_groups)}" if self.avoid_groups else ""
        return (
            f"{self.name}: {len(self.bundles)} x {self.bundles[0]} on {self.nodes} node(s), "
            f"{len(self.slices)} {self.strategy} slice(s) of {self.bundles_per_slice}{avoid}"
        )


@dataclass(frozen=True)
class PlacementPlan:
    recipe_name: str
    groups: tuple[BundlePlan, ...]  # created in this order; a group may only avoid an earlier one

    def group(self, name: str) -> BundlePlan:
        for candidate in self.groups:
            if candidate.name == name:
                return candidate
        raise KeyError(name)

    def describe(self) -> str:
        return "\n".join(g.describe() for g in self.groups)


def plan_placement(recipe: "Recipe") -> PlacementPlan:
    """The groups the recipe needs, without touching Ray."""
    cluster, actor, rollout = recipe.cluster, recipe.actor, recipe.rollout
    if actor.num_workers % actor.nodes:
        raise PlacementError(
            f"actor.num_workers: {actor.num_workers} workers do not split evenly over actor.nodes={actor.nodes}"
        )
    per_node = actor.num_workers // actor.nodes
    if cluster.gpus_per_node == 0:
        trainer_bundle = {"CPU": CPUS_PER_CPU_WORKER}
        rollout_bundle = {"CPU": CPUS_PER_CPU_WORKER}
        avoid: tuple[str, ...] = ()
    else:
        if per_node > cluster.gpus_per_node:
            raise PlacementError(
                f"actor.num_workers: {per_node} one-GPU workers per node exceed "
                f"cluster.gpus_per_node={cluster.gpus_per_node}"
            )
        # cluster.colocate 'gpu': half a GPU each, so Ray puts both on the one GPU (a one-GPU smoke test)
        share = 0.5 if cluster.colocate == "gpu" else 1
        trainer_bundle = {"GPU": share, "CPU": CPUS_PER_TRAINER_GPU}
        rollout_bundle = {"GPU": rollout.tensor_parallel * share, "CPU": CPUS_PER_ROLLOUT_REPLICA}
        avoid = (TRAINER,) if cluster.colocate == "none" else ()
    trainer = BundlePlan(
        name=TRAINER,
        bundles=tuple(dict(trainer_bundle) for _ in range(actor.num_workers)),
        strategy="STRICT_PACK",
        nodes=actor.nodes,
        bundles_per_slice=per_node,
        distinct_slice_nodes=actor.nodes > 1,
    )
    rollout_group = BundlePlan(
        name=ROLLOUT,
        bundles=tuple(dict(rollout_bundle) for _ in range(rollout.num_replicas)),
        strategy="STRICT_PACK",
        nodes=rollout.num_replicas,
        bundles_per_slice=1,
        distinct_slice_nodes=False,  # two TP4 replicas may share an 8-GPU node
        avoid_groups=avoid,
    )
    return PlacementPlan(recipe.name, (trainer, rollout_group))


@dataclass
class Placement:
    """Ray placement groups realising a plan; ``bundle(group, i)`` finds worker i's slot."""

    plan: PlacementPlan
    slices: dict[str, list["PlacementGroup"]] = field(default_factory=dict)

    def bundle(self, group: str, index: int) -> tuple["PlacementGroup", int]:
        k = self.plan.group(group).bundles_per_slice
        return self.slices[group][index // k], index % k

    def nodes_of(self, group: str) -> set[str]:
        from ray.util.placement_group import placement_group_table

        return {n for pg in self.slices.get(group, [])
                for n in placement_group_table(pg)["bundles_to_node_id"].values()}

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for pgs in self.slices.values():
            for pg in pgs:
                remove_placement_group(pg)
        self.slices.clear()


def create_placement_groups(plan: PlacementPlan, timeout_s: float = 120.0) -> Placement:
    """Create every slice in plan order and wait until all are placed; all or nothing within ``timeout_s``."""
    from ray.util.placement_group import placement_group

    placed = Placement(plan)
    deadline = time.monotonic() + timeout_s
    for group in plan.groups:
        placed.slices[group.name] = []
        taken = set().union(*(placed.nodes_of(g) for g in group.avoid_groups))
        for index, bundles in enumerate(group.slices):
            selector = None
            if taken:
                selector = [{NODE_ID_LABEL: f"!in({', '.join(sorted(taken))})"} for _ in bundles]
            pg = placement_group(
                list(bundles), strategy=group.strategy, name=f"repro-{group.name}-{index}",
                bundle_label_selector=selector
            )
            placed.slices[group.name].append(pg)
            try:
                ready = pg.wait(max(0.0, deadline - time.monotonic()))
            except BaseException:  # Ctrl-C while waiting: give the reserved slices back
                placed.remove()
                raise
            if not ready:
                message = _unplaceable(group, index, taken, timeout_s)
                placed.remove()
                raise PlacementError(message)
            if group.distinct_slice_nodes:
                taken |= placed.nodes_of(group.name)
    return placed


def _unplaceable(group: BundlePlan, index: int, excluded: set[str], timeout_s: float) -> str:
    import ray

    totals = ", ".join(f"{k}: {v:g}" for k, v in group.totals().items())
    nodes = "; ".join(
        f"node {n['NodeID'][:8]} GPU {n['Resources'].get('GPU', 0):g} CPU {n['Resources'].get('CPU', 0):g}"
        for n in ray.nodes() if n["Alive"]
    )
    avoided = (f", avoiding {len(excluded)} node(s) already holding {'/'.join(group.avoid_groups) or group.name}"
               if excluded else "")
    return (
        f"{group.name} group could not be placed within {timeout_s:g} s: slice {index + 1} of {len(group.slices)} "
        f"({group.bundles_per_slice} bundle(s) of {group.bundles[0]} {group.strategy}, all on one node{avoided}); "
        f"the group asks {len(group.bundles)} bundles ({totals}) on {group.nodes} node(s). "
        f"ray.cluster_resources() offers {_short(ray.cluster_resources())} (available now "
        f"{_short(ray.available_resources())}) on nodes: {nodes}"
    )


def _short(resources: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {resources[k]:g}" for k in ("GPU", "CPU") if k in resources) + "}"


@dataclass(frozen=True)
class PlacementRow:
    group: str
    bundle_index: int  # worker rank within the group
    node_id: str
    node_ip: str
    resources: dict[str, float]


def placement_table(placed: Placement) -> list[PlacementRow]:
    """Which node holds each bundle, from the GCS (``ray.util.state`` needs the dashboard, which we leave off)."""
    import ray
    from ray.util.placement_group import placement_group_table

    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    rows = []
    for group in placed.plan.groups:
        for slice_index, pg in enumerate(placed.slices.get(group.name, [])):
            info = placement_group_table(pg)
            for local, node in sorted(info["bundles_to_node_id"].items()):
                rank = slice_index * group.bundles_per_slice + local
                rows.append(PlacementRow(group.name, rank, node, ips.get(node, "?"), dict(info["bundles"][local])))
    return rows


def format_placement_table(rows: list[PlacementRow]) -> str:
    lines = [f"{'group':<8} {'bundle':>6}  {'node':<12} {'ip':<15} resources"]
    for row in rows:
        resources = ", ".join(f"{k}: {v:g}" for k, v in sorted(row.resources.items()))
        lines.append(f"{row.group:<8} {row.bundle_index:>6}  {row.node_id[:12]:<12} {row.node_ip:<15} {resources}")
    return "\n".join(lines)
