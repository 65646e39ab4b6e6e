"""The trainer's memory per rank for the recipe's layout, against device memory and each node's host RAM.

One function, ``memory_budget(recipe, device_bytes, host_bytes)``: `repro launch --dry-run` prints it with the
recipe's capacities (``cluster.device_memory_gb``, ``cluster.host_memory_gb``), `repro check` judges it against the
capacities it measures on the node. It is an estimate from the recipe's numbers, and says so; its assumptions:

- Parameters of a rank (stage s with L_s layers; Korthikanti et al.'s sharding, arXiv:2205.05198): routed-expert
  parameters ``model.num_expert_parameters / num_layers`` per layer, split over EP x ETP; every other parameter
  split over TP, spread evenly over the layers (DeepSeek-V4-Flash's vary 138-153 M), except the embedding on the
  first stage and the (untied) output layer on the last, ``vocab_size x hidden_size`` each. Replicated norms and
  routers are counted as split (they are < 0.1 % of a layer).
- Weights in ``actor.dtype``; gradients fp32 on the Megatron backend (the mapping sets ``grad_reduce_in_fp32``), in
  the weights' dtype on the embedded one.
- Optimizer state per parameter, sharded over data parallelism (experts over expert-data parallelism): see
  ``optimizer_bytes`` -- it depends on who steps it.
- Activations with full recompute (``actor.recompute: full``): each layer keeps its input, ``tokens x hidden x
  residual_streams`` in the compute dtype, split over TP under sequence parallelism, for each micro-batch in flight
  (1F1B: stage s holds up to PP - s); plus one layer's working set while it is recomputed, 34 x tokens x hidden
  bytes / TP (Korthikanti et al., eq. 2 with flash attention, the a*s/h term gone); plus the last stage's fp32
  logits and their gradient, 2 x tokens x vocab / TP x 4 bytes. Without recompute every layer keeps its working set.
  tokens = ``actor.max_tokens_per_micro_batch``. MoE dispatch buffers and the allocator's fragmentation are not
  counted: leave headroom.
- Weight sync: two buckets of ``weight_sync.bucket_mb`` MiB and the largest full tensor (the vocab x hidden
  embedding) gathered on the device of a sending rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from repro.recipes.backends import engine_of, trainer_of
from repro.recipes.consistency import pipeline_stage_layers

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe

DTYPE_BYTES = {"bf16": 2, "fp32": 4}
WORKING_SET_BYTES = 34  # per token x hidden of one layer's activations (Korthikanti et al. 2022, flash attention)
MIB = 1024**2


@dataclass(frozen=True)
class OptimizerBytes:
    """Bytes per parameter of optimizer state, and who holds it (the row label says which optimizer)."""

    master: int        # fp32 master copy (0 when the fp32 weights are their own masters)
    moments: int       # Adam's exp_avg + exp_avg_sq
    offloaded_moments: int  # the same two, for the share held in host memory
    host_gradient: int  # a host copy of the gradient the offloaded step reads
    holder: str


def optimizer_bytes(recipe: "Recipe") -> OptimizerBytes:
    """Optimizer state per parameter for the recipe's trainer.

    - embedded: torch's AdamW over fp32 masters (``repro.train.optimizer``/``zero1``): 4 + 4 + 4, the master
      being the weight itself in fp32.
    - megatron, engine repro: megatron-core 0.16.1's distributed optimizer as ``megatron_layout`` configures it.
      On the device its moments take ``actor.optimizer_moment_dtype``; the offloaded share goes through its
      ``HybridDeviceOptimizer``, which keeps an fp32 copy of each parameter, an fp32 gradient copy and torch
      AdamW's fp32 moments in host memory whatever the moment dtype says (read in megatron/core/optimizer/
      __init__.py and cpu_offloading/hybrid_optimizer.py).
    - engine lumenrl: LumenRL's streamed optimizer (its DSV4 config: fp32 masters, moments in
      ``streamed_optimizer_moment_dtype``); its 256 MiB streaming chunks are not counted.
    """
    actor = recipe.actor
    moment = 2 * DTYPE_BYTES[actor.optimizer_moment_dtype]
    if trainer_of(recipe).own_adamw:
        master = 0 if actor.dtype == "fp32" else 4
        return OptimizerBytes(master, 8, 8, 0, "repro AdamW (fp32 masters and moments)")
    if engine_of(recipe).streamed_optimizer:
        return OptimizerBytes(4, moment, moment, 0,
                              f"LumenRL streamed optimizer (fp32 masters, {actor.optimizer_moment_dtype} moments)")
    return OptimizerBytes(4, moment, 8, 4, "megatron-core 0.16.1 distributed optimizer (offloaded share: fp32)")


@dataclass
class StageBudget:
    """One trainer rank of pipeline stage ``stage`` (the ranks of a stage hold alike): bytes by part."""

    stage: int
    layers: int
    parameters: int
    device: dict[str, int] = field(default_factory=dict)
    host: dict[str, int] = field(default_factory=dict)

    @property
    def device_total(self) -> int:
        return sum(self.device.values())

    @property
    def host_total(self) -> int:
        return sum(self.host.values())


@dataclass
class MemoryBudget:
    stages: list[StageBudget]
    node_host: list[int]            # host bytes each trainer node needs (its ranks' host parts)
    device_capacity: int | None     # bytes per device; None in CPU mode
    host_capacity: int | None       # bytes per node; None when unknown
    optimizer: OptimizerBytes
    problems: list[str]             # what does not fit, each naming the field to change

    @property
    def busiest(self) -> StageBudget:
        return max(self.stages, key=lambda s: (s.device_total, -s.stage))


def stage_parameters(recipe: "Recipe", layers: int, first: bool, last: bool) -> tuple[int, int]:
    """(parameters held, parameters whose optimizer state this rank keeps) by one rank of a stage."""
    model, actor = recipe.model, recipe.actor
    tp, ep, etp = actor.tensor_parallel, actor.expert_parallel, actor.expert_tensor_parallel
    world_pp = actor.num_workers // actor.pipeline_parallel
    dp, edp = world_pp // tp, world_pp // (ep * etp)
    table = model.vocab_size * model.hidden_size
    dense_per_layer = (model.num_parameters - model.num_expert_parameters - 2 * table) / model.num_layers
    expert_per_layer = model.num_expert_parameters / model.num_layers
    dense = layers * dense_per_layer + table * (first + last)
    experts = layers * expert_per_layer
    held = dense / tp + experts / (ep * etp)
    return round(held), round(dense / (tp * dp) + experts / (ep * etp * edp))


def _activations(recipe: "Recipe", stage: int, layers: int, last: bool) -> int:
    actor, model = recipe.actor, recipe.model
    tp = actor.tensor_parallel
    tokens = actor.max_tokens_per_micro_batch
    split = tp if actor.sequence_parallel and tp > 1 else 1
    width = DTYPE_BYTES[actor.dtype]
    in_flight = actor.pipeline_parallel - stage
    working = WORKING_SET_BYTES * tokens * model.hidden_size // tp
    if actor.recompute == "full":
        kept = in_flight * layers * tokens * model.hidden_size * model.residual_streams * width // split + working
    else:
        kept = in_flight * layers * working
    logits = 2 * tokens * model.vocab_size // tp * 4 if last else 0
    return kept + logits


def memory_budget(recipe: "Recipe", device_bytes: int | None = None, host_bytes: int | None = None) -> MemoryBudget:
    """Per-rank bytes for the recipe's layout, judged against ``device_bytes`` per device and ``host_bytes`` per
    node (default: the recipe's ``cluster.device_memory_gb`` / ``cluster.host_memory_gb``)."""
    actor, cluster = recipe.actor, recipe.cluster
    cpu = cluster.gpus_per_node == 0
    if device_bytes is None and not cpu:
        device_bytes = int(cluster.device_memory_gb * 1e9)
    if host_bytes is None and cluster.host_memory_gb is not None:
        host_bytes = int(cluster.host_memory_gb * 1e9)
    opt = optimizer_bytes(recipe)
    layers = pipeline_stage_layers(recipe.model.num_layers, actor.pipeline_parallel,
                                   actor.num_layers_in_first_pipeline_stage, actor.num_layers_in_last_pipeline_stage)
    offload = (actor.optimizer_offload_fraction if actor.optimizer_cpu_offload else 0.0) if not cpu else 1.0
    grad_width = 4 if trainer_of(recipe).fp32_gradients else DTYPE_BYTES[actor.dtype]
    stages = []
    for stage, count in enumerate(layers):
        first, last = stage == 0, stage == len(layers) - 1
        held, owned = stage_parameters(recipe, count, first, last)
        on_device = {
            "weights": held * DTYPE_BYTES[actor.dtype],
            "gradients": held * grad_width,
            "optimizer state": round(owned * (1 - offload) * (opt.master + opt.moments)),
            "activations": _activations(recipe, stage, count, last),
            "weight-sync buckets": 2 * recipe.weight_sync.bucket_mb * MIB
                                   + recipe.model.vocab_size * recipe.model.hidden_size * DTYPE_BYTES[actor.dtype],
        }
        on_host = {"optimizer state": round(owned * offload * (opt.master + opt.offloaded_moments + opt.host_gradient))}
        if cpu:  # no accelerator: what would sit on the device lives in host memory too
            on_host = {**{k: v for k, v in on_device.items() if k != "optimizer state"}, **on_host}
            on_device = {}
        stages.append(StageBudget(stage, count, held, on_device, on_host))
    per_node = actor.num_workers // actor.nodes
    per_stage = actor.num_workers // actor.pipeline_parallel
    node_host = [sum(stages[rank // per_stage].host_total for rank in range(node * per_node, (node + 1) * per_node))
                 for node in range(actor.nodes)]
    budget = MemoryBudget(stages, node_host, device_bytes, host_bytes, opt, [])
    budget.problems = _problems(recipe, budget)
    return budget


def _problems(recipe: "Recipe", budget: MemoryBudget) -> list[str]:
    actor = recipe.actor
    problems = []
    if budget.device_capacity is not None:
        over = [s.stage for s in budget.stages if s.device_total > budget.device_capacity]
        if over:
            worst = budget.busiest
            part, size = max(worst.device.items(), key=lambda kv: kv[1])
            problems.append(f"device: trainer ranks of pipeline stage(s) {', '.join(map(str, over))} exceed "
                            f"{_gb(budget.device_capacity)} (cluster.device_memory_gb); stage {worst.stage} needs "
                            f"{_gb(worst.device_total)}, its largest part {part} {_gb(size)}: "
                            f"{_device_fix(recipe, part)}")
    if budget.host_capacity is not None:
        over = [node for node, need in enumerate(budget.node_host) if need > budget.host_capacity]
        if over:
            need = max(budget.node_host)
            problems.append(f"host: trainer node(s) {', '.join(map(str, over))} need up to {_gb(need)} of host RAM "
                            f"for the offloaded optimizer, over {_gb(budget.host_capacity)} per node: lower "
                            f"actor.optimizer_offload_fraction (now {actor.optimizer_offload_fraction}) or spread "
                            "the trainer over more actor.nodes")
    return problems


def _device_fix(recipe: "Recipe", part: str) -> str:
    actor = recipe.actor
    if part == "optimizer state":
        if not actor.optimizer_cpu_offload:
            return "set actor.optimizer_cpu_offload: true (the state moves to host memory)"
        return f"raise actor.optimizer_offload_fraction (now {actor.optimizer_offload_fraction})"
    if part == "activations":
        return (f"lower actor.max_tokens_per_micro_batch (now {actor.max_tokens_per_micro_batch}) "
                "or set actor.recompute: full")
    if part == "weight-sync buckets":
        return f"lower weight_sync.bucket_mb (now {recipe.weight_sync.bucket_mb})"
    return "split the model further (actor.pipeline_parallel, actor.expert_parallel, actor.tensor_parallel)"


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB"


def format_budget(recipe: "Recipe", budget: MemoryBudget) -> str:
    """The budget as a table: one column per pipeline stage (GB per rank), then each node's host RAM."""
    parts = list(dict.fromkeys(k for s in budget.stages for k in (*s.device, *s.host)))
    largest = max([s.device_total for s in budget.stages] + [s.host_total for s in budget.stages])
    unit, scale = ("GB", 1e9) if largest >= 1e9 else ("MB", 1e6)  # a tiny model's budget in readable numbers
    head = f"{unit + ' per trainer rank (estimate)':<34}" + "".join(
        f"{f'stage {s.stage} ({s.layers} L)':>16}" for s in budget.stages)
    lines = ["", f"memory budget of {recipe.name}: {budget.optimizer.holder}; "
                 "assumptions in repro/readiness/memory_budget.py",
             head, f"{'parameters held (millions)':<34}" + "".join(
                 f"{s.parameters / 1e6:>16,.1f}" for s in budget.stages)]
    for place, attr in (("device", "device"), ("host", "host")):
        if not any(getattr(s, attr) for s in budget.stages):
            continue
        for part in parts:
            if any(part in getattr(s, attr) for s in budget.stages):
                lines.append(f"{place + ' ' + part:<34}" + "".join(f"{getattr(s, attr).get(part, 0) / scale:>16,.1f}"
                                                                  for s in budget.stages))
        total = [sum(getattr(s, attr).values()) for s in budget.stages]
        capacity = budget.device_capacity if attr == "device" else None
        lines.append(f"{place + ' total':<34}" + "".join(f"{t / scale:>16,.1f}" for t in total)
                     + (f"   of {_gb(capacity)} per device" if capacity else ""))
    host = ", ".join(_gb(n) for n in budget.node_host)
    capacity = (f"of {_gb(budget.host_capacity)} per node" if budget.host_capacity
                else "host RAM unknown: set cluster.host_memory_gb")
    lines.append(f"host RAM per trainer node: {host} ({capacity})")
    if budget.problems:
        lines += [f"DOES NOT FIT: {p}" for p in budget.problems]
    elif budget.device_capacity is None:
        lines.append("CPU mode: every part lives in host memory (`repro check` compares it with this host's RAM)")
    else:
        lines.append("fits: every rank within its device" + (", every node within its host RAM" if budget.host_capacity
                                                             else "; host RAM not judged"))
    return "\n".join(lines)


def checkpoint_bytes(recipe: "Recipe") -> int:
    """Weights in the trainer dtype + fp32 master copy (bf16 only) + two fp32 Adam moments, per parameter."""
    per_param = {"bf16": 2 + 4 + 8, "fp32": 4 + 8}[recipe.actor.dtype]
    return recipe.model.num_parameters * per_param
