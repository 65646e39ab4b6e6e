"""Cross-field checks of a recipe: layouts that must multiply out, resources that must fit.

Each problem is reported as ``field.path: what is wrong`` so the user knows which line to edit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe


def layout_problems(recipe: "Recipe") -> list[str]:
    """Megatron's layout rules: TP x PP x DP = workers, EP x ETP x PP divides workers, EP divides experts."""
    actor, model = recipe.actor, recipe.model
    tp, pp, ep, etp = actor.tensor_parallel, actor.pipeline_parallel, actor.expert_parallel, actor.expert_tensor_parallel
    problems = []
    if actor.num_workers % (tp * pp):
        problems.append(
            f"actor.num_workers: {actor.num_workers} workers is not TP x PP x DP for TP={tp}, PP={pp} "
            f"(needs a multiple of {tp * pp})"
        )
    if actor.num_workers % (ep * etp * pp):
        problems.append(
            f"actor.expert_parallel: EP={ep} x ETP={etp} x PP={pp} = {ep * etp * pp} does not divide "
            f"actor.num_workers={actor.num_workers}"
        )
    if model.num_routed_experts % ep:
        problems.append(f"actor.expert_parallel: EP={ep} does not divide model.num_routed_experts={model.num_routed_experts}")
    if model.num_experts_per_tok > model.num_routed_experts:
        problems.append(
            f"model.num_experts_per_tok: top-{model.num_experts_per_tok} exceeds model.num_routed_experts={model.num_routed_experts}"
        )
    return problems


def resource_problems(recipe: "Recipe") -> list[str]:
    """GPU accounting: trainer and rollout groups on separate nodes, each within the cluster."""
    cluster, actor, rollout = recipe.cluster, recipe.actor, recipe.rollout
    problems = []
    if cluster.gpus_per_node == 0:
        if cluster.accelerator != "cpu":
            problems.append(f"cluster.accelerator: {cluster.accelerator!r} with gpus_per_node=0; use 'cpu'")
        return problems
    if actor.nodes + rollout.num_replicas * _nodes_for(rollout.tensor_parallel, cluster.gpus_per_node) > cluster.num_nodes:
        problems.append(
            f"cluster.num_nodes: {cluster.num_nodes} nodes cannot host actor.nodes={actor.nodes} trainer nodes plus "
            f"{rollout.num_replicas} rollout replica(s) of TP={rollout.tensor_parallel}"
        )
    if actor.num_workers > actor.nodes * cluster.gpus_per_node:
        problems.append(
            f"actor.num_workers: {actor.num_workers} one-GPU workers do not fit on actor.nodes={actor.nodes} x "
            f"cluster.gpus_per_node={cluster.gpus_per_node}"
        )
    if rollout.tensor_parallel > cluster.gpus_per_node:
        problems.append(
            f"rollout.tensor_parallel: TP={rollout.tensor_parallel} spans more than one node "
            f"(cluster.gpus_per_node={cluster.gpus_per_node})"
        )
    return problems


def _nodes_for(gpus: int, gpus_per_node: int) -> int:
    return -(-gpus // gpus_per_node)


def algorithm_problems(recipe: "Recipe") -> list[str]:
    problems = []
    if recipe.lengths.max_response >= recipe.lengths.max_context:
        problems.append(
            f"lengths.max_response: {recipe.lengths.max_response} leaves no room for a prompt in "
            f"lengths.max_context={recipe.lengths.max_context}"
        )
    beta1, beta2 = recipe.optim.betas
    if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
        problems.append(f"optim.betas: each beta must be in [0, 1), got {recipe.optim.betas}")
    if any(b <= 0 for b in recipe.rollout.fp8_block):
        problems.append(f"rollout.fp8_block: block sizes must be positive, got {recipe.rollout.fp8_block}")
    if recipe.routing_replay.enabled and recipe.model.num_experts_per_tok < 1:
        problems.append("routing_replay.enabled: needs an MoE model")
    return problems


def engine_problems(recipe: "Recipe") -> list[str]:
    """What the chosen engine cannot run: LumenRL takes only what its config can express."""
    if recipe.engine != "lumenrl":
        return []
    from repro.lumenrl.config import recipe_problems

    return recipe_problems(recipe)


def check_consistency(recipe: "Recipe") -> None:
    problems = layout_problems(recipe) + resource_problems(recipe) + algorithm_problems(recipe) + engine_problems(recipe)
    if problems:
        raise ValueError("\n".join(problems))
