"""Cross-field checks of a recipe: layouts that must multiply out, resources that must fit.

Each problem is reported as ``field.path: what is wrong`` so the user knows which line to edit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from repro.recipes.backends import engine_of, engine_problems, trainer_of

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe


def layout_problems(recipe: "Recipe") -> list[str]:
    """Megatron's layout rules: TP x PP x DP = workers, EP x ETP x PP divides workers, EP divides experts."""
    actor, model = recipe.actor, recipe.model
    tp, pp, ep, etp = (actor.tensor_parallel, actor.pipeline_parallel, actor.expert_parallel,
                       actor.expert_tensor_parallel)
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
        problems.append(f"actor.expert_parallel: EP={ep} does not divide "
                        f"model.num_routed_experts={model.num_routed_experts}")
    problems += pipeline_split_problems(recipe)
    if model.num_expert_parameters >= model.num_parameters:
        problems.append(f"model.num_expert_parameters: {model.num_expert_parameters:,} is not below "
                        f"model.num_parameters={model.num_parameters:,}")
    if model.num_experts_per_tok > model.num_routed_experts:
        problems.append(
            f"model.num_experts_per_tok: top-{model.num_experts_per_tok} exceeds "
            f"model.num_routed_experts={model.num_routed_experts}"
        )
    return problems


def pipeline_stage_layers(num_layers: int, stages: int, first: int | None, last: int | None) -> list[int]:
    """Layers per pipeline stage, megatron-core's rule (``TransformerConfig.__post_init__``, "Uneven PP"): the
    first/last stage take what is given, the middle stages share the rest evenly; with neither given every stage
    takes num_layers / stages. Raises ValueError naming the field when the split is impossible."""
    if stages == 1:
        if first is not None or last is not None:
            raise ValueError("actor.num_layers_in_first_pipeline_stage / _last_: "
                             "set only with actor.pipeline_parallel > 1")
        return [num_layers]
    if first is None and last is None:
        if num_layers % stages:
            raise ValueError(f"actor.pipeline_parallel: {num_layers} layers (model.num_layers) do not split evenly "
                             f"over {stages} stages; set actor.num_layers_in_first_pipeline_stage / _last_")
        return [num_layers // stages] * stages
    middle_stages = stages - (first is not None) - (last is not None)
    middle_layers = num_layers - (first or 0) - (last or 0)
    if (middle_layers < 0 or bool(middle_layers) != bool(middle_stages)
            or (middle_stages and middle_layers % middle_stages)):
        raise ValueError(
            f"actor.num_layers_in_first_pipeline_stage={first}, actor.num_layers_in_last_pipeline_stage={last}: the "
            f"remaining {middle_layers} of model.num_layers={num_layers} do not split evenly over {middle_stages} "
            f"middle stage(s) of actor.pipeline_parallel={stages}")
    middle = [middle_layers // middle_stages] * middle_stages if middle_stages else []
    return ([first] if first is not None else []) + middle + ([last] if last is not None else [])


def pipeline_split_problems(recipe: "Recipe") -> list[str]:
    actor = recipe.actor
    try:
        pipeline_stage_layers(recipe.model.num_layers, actor.pipeline_parallel,
                              actor.num_layers_in_first_pipeline_stage, actor.num_layers_in_last_pipeline_stage)
    except ValueError as err:
        return [str(err)]
    return []


def optimizer_problems(recipe: "Recipe") -> list[str]:
    """What the chosen trainer's optimizer cannot hold: the embedded AdamW (torch's) keeps fp32 moments."""
    actor, moments = recipe.actor, trainer_of(recipe).moments
    if moments == "fp32" and actor.optimizer_moment_dtype != "fp32":
        return [f"actor.optimizer_moment_dtype: {actor.optimizer_moment_dtype!r} needs the Megatron backend; the "
                "embedded trainer's AdamW keeps fp32 moments (set fp32)"]
    if moments == "distributed" and actor.optimizer_moment_dtype != "fp32" and actor.num_workers == 1:
        return [f"actor.optimizer_moment_dtype: {actor.optimizer_moment_dtype!r} needs megatron's distributed "
                "optimizer (precision-aware), which one trainer worker does not build (set fp32)"]
    return []


def resource_problems(recipe: "Recipe") -> list[str]:
    """GPU accounting: trainer and rollout groups on separate nodes, each within the cluster."""
    cluster, actor, rollout = recipe.cluster, recipe.actor, recipe.rollout
    problems = []
    if cluster.gpus_per_node == 0:
        if cluster.accelerator != "cpu":
            problems.append(f"cluster.accelerator: {cluster.accelerator!r} with gpus_per_node=0; use 'cpu'")
        if cluster.colocate != "none":
            problems.append(f"cluster.colocate: {cluster.colocate!r} places GPU workers; CPU mode has none")
        return problems
    if engine_of(recipe).colocates:  # the engine places both on the same GPUs; its own checks say what fits
        return problems
    if cluster.colocate != "none":
        return problems + colocated_problems(recipe)
    if (actor.nodes + rollout.num_replicas * _nodes_for(rollout.tensor_parallel, cluster.gpus_per_node)
            > cluster.num_nodes):
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


def colocated_problems(recipe: "Recipe") -> list[str]:
    """The one-node layouts of ``cluster.colocate``: everything on one node; 'gpu' shares one trainer rank's GPU
    with a TP-1 rollout."""
    cluster, actor, rollout = recipe.cluster, recipe.actor, recipe.rollout
    where = f"cluster.colocate={cluster.colocate!r}"
    if cluster.num_nodes != 1 or actor.nodes != 1 or rollout.num_replicas != 1:
        return [f"{where}: one node (cluster.num_nodes, actor.nodes, rollout.num_replicas all 1)"]
    if cluster.colocate == "gpu" and (actor.num_workers != 1 or rollout.tensor_parallel != 1):
        return [f"{where}: one trainer worker and a TP-1 rollout share one GPU (actor.num_workers="
                f"{actor.num_workers}, rollout.tensor_parallel={rollout.tensor_parallel})"]
    if cluster.colocate == "node" and actor.num_workers + rollout.tensor_parallel > cluster.gpus_per_node:
        return [f"{where}: {actor.num_workers} trainer GPU(s) + rollout TP={rollout.tensor_parallel} exceed "
                f"cluster.gpus_per_node={cluster.gpus_per_node}"]
    return []


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
    updates, rows = recipe.algorithm.updates_per_step, recipe.trajectories_per_step
    if updates > rows:  # each update takes its own share of the step's rows (repro.train.grpo_update.row_groups)
        problems.append(f"algorithm.updates_per_step: {updates} updates cannot each take rows of a batch of {rows} "
                        f"(algorithm.prompts_per_step x responses_per_prompt); at most {rows}")
    if recipe.routing_replay.enabled and recipe.model.num_experts_per_tok < 1:
        problems.append("routing_replay.enabled: needs an MoE model")
    return problems


def check_consistency(recipe: "Recipe") -> None:
    problems = (layout_problems(recipe) + resource_problems(recipe) + algorithm_problems(recipe)
                + optimizer_problems(recipe) + engine_problems(recipe))
    if problems:
        raise ValueError("\n".join(problems))
