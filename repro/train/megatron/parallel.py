"""What a Megatron trainer rank needs beyond one process: rendezvous, vocab-parallel scores, gradient reduction
and norm, and full (world-size-1) weights -> this rank's shard (the way back, shards -> full weights, is
``repro.train.megatron.stream_weights``).

A *full* name and tensor are those of the same model built at world size 1: global layer index (pipeline
stages number their layers locally), global expert index (an EP rank holds experts ``ep * E_local ..``) and the
whole tensor (tensor-parallel shards concatenated along ``partition_dim``). Megatron's gated MLP keeps ``[gate_r;
up_r]`` on rank r, so a full ``linear_fc1`` is ``[gate_0 .. gate_n; up_0 .. up_n]``, not the ranks' blocks in order.

Every function here that communicates must be called by all ranks of the world in the same order (they
iterate the model's parameters, which the members of each group share).
"""

from __future__ import annotations

import os
import re
from typing import Callable

import torch
import torch.distributed as dist

from repro.devices import DeviceError, collective_device, this_process_device_index
from repro.train.base import TrainerError

RENDEZVOUS_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def init_distributed_from_env() -> None:
    """``torch.distributed`` from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (gloo on CPU, nccl on CUDA/ROCm). On a GPU
    the rank first takes its device: the one Ray gave it (``repro.devices.local_device_index``; under Ray's
    isolation that is index 0, whatever LOCAL_RANK says), else LOCAL_RANK (torchrun)."""
    if dist.is_initialized():
        return
    missing = [name for name in RENDEZVOUS_ENV if not os.environ.get(name)]
    if missing:
        raise TrainerError(f"trainer rank: rendezvous variables not set: {', '.join(missing)}")
    if torch.cuda.is_available():
        try:
            torch.cuda.set_device(this_process_device_index())
        except DeviceError as err:
            raise TrainerError(f"trainer rank {os.environ['RANK']}: {err}") from err
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")


def init_single_rank() -> None:
    """A one-rank NCCL world on this process's GPU: megatron-core's model-parallel groups need a process group even
    for one trainer rank (on CPU the shim makes a gloo one); Ray starts a lone rank without rendezvous variables."""
    if dist.is_initialized():
        return
    try:
        torch.cuda.set_device(this_process_device_index())
    except DeviceError as err:
        raise TrainerError(f"trainer rank 0: {err}") from err
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)


def join_world(num_workers: int) -> None:
    """Join the trainer's torch.distributed world: the rendezvous Ray set up for several ranks, a one-rank NCCL
    world for a lone rank on a GPU, nothing for a lone CPU rank (``ensure_model_parallel`` installs the CPU shim)."""
    if num_workers > 1:
        init_distributed_from_env()
    elif torch.cuda.is_available():
        init_single_rank()


def ensure_model_parallel(parallel_state_kwargs: dict[str, int]) -> None:
    """Initialise megatron's model-parallel groups with these sizes, or check that the live ones match."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if not torch.cuda.is_available():
        from repro.train.megatron.cpu_shim import install_cpu_shim

        install_cpu_shim()
    elif not dist.is_initialized():
        raise TrainerError("MegatronTrainer: torch.distributed is not initialised "
                           "(start the workers with torchrun/Ray)")
    sizes = {k: int(v) for k, v in parallel_state_kwargs.items()}
    if parallel_state.model_parallel_is_initialized():
        live = {
            "tensor_model_parallel_size": parallel_state.get_tensor_model_parallel_world_size(),
            "pipeline_model_parallel_size": parallel_state.get_pipeline_model_parallel_world_size(),
            "expert_model_parallel_size": parallel_state.get_expert_model_parallel_world_size(),
            "expert_tensor_parallel_size": parallel_state.get_expert_tensor_parallel_world_size(),
            "context_parallel_size": parallel_state.get_context_parallel_world_size(),
        }
        wrong = {k: (sizes[k], live[k]) for k in live if k in sizes and sizes[k] != live[k]}
        if wrong:
            raise TrainerError("MegatronTrainer: model parallelism is already initialised differently "
                               f"(want, live): {wrong}")
        return
    world = dist.get_world_size()
    model_parallel = (sizes["tensor_model_parallel_size"] * sizes["pipeline_model_parallel_size"]
                      * sizes["context_parallel_size"])
    if world % model_parallel:
        raise TrainerError(
            f"actor.tensor_parallel x actor.pipeline_parallel = {model_parallel} does not divide the world size {world}"
        )
    parallel_state.initialize_model_parallel(**sizes)


# ---- scores over a vocabulary split across tensor-parallel ranks -------------------------------------------


def vocab_parallel_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """[b, t, V/tp] logits (this rank's vocabulary slice), [b, t] targets -> [b, t] log softmax(logits/T)[target].

    Differentiable: megatron's ``vocab_parallel_cross_entropy`` (max, sum-exp and the target logit all-reduced
    over the tensor-parallel group) is exactly -log p; at TP 1 it is the ordinary log-softmax gather.
    """
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    scaled = logits.float() / temperature
    return -vocab_parallel_cross_entropy(scaled.transpose(0, 1).contiguous(),
                                         targets.transpose(0, 1).contiguous()).transpose(0, 1)


@torch.no_grad()
def vocab_parallel_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[b, t, V/tp] -> [b, t] entropy of softmax(logits/T) over the whole vocabulary (a metric: no gradient).

    H = log Z - sum_v p_v z_v with z = logits/T - max, Z = sum_v exp(z_v); every sum runs over all TP ranks.
    """
    from megatron.core import parallel_state

    group = parallel_state.get_tensor_model_parallel_group()
    z = logits.float() / temperature
    zmax = z.max(dim=-1, keepdim=True).values
    dist.all_reduce(zmax, op=dist.ReduceOp.MAX, group=group)
    z = z - zmax
    e = z.exp()
    sums = torch.stack([e.sum(-1), (e * z).sum(-1)])
    dist.all_reduce(sums, group=group)
    return sums[0].log() - sums[1] / sums[0]


# ---- gradients ---------------------------------------------------------------------------------------------


def is_expert(name: str) -> bool:
    return ".experts." in name


def _param_groups(name: str):
    """(tensor-parallel group, its rank, data-parallel group) of a parameter: expert or dense ones."""
    from megatron.core import parallel_state as ps

    if is_expert(name):
        return (ps.get_expert_tensor_parallel_group(), ps.get_expert_tensor_parallel_rank(),
                ps.get_expert_data_parallel_group())
    return ps.get_tensor_model_parallel_group(), ps.get_tensor_model_parallel_rank(), ps.get_data_parallel_group()


def reduce_gradients(model: torch.nn.Module) -> None:
    """Sum ``.grad`` over data-parallel replicas (each took its own rows of the update, normalised by the whole
    update's count) and, under sequence parallelism, the replicated norms' grads over the TP group."""
    from megatron.core import parallel_state as ps

    for name, param in model.named_parameters():
        if param.grad is None:
            continue
        _, _, dp_group = _param_groups(name)
        if dist.get_world_size(dp_group) > 1:
            dist.all_reduce(param.grad, group=dp_group)
        if getattr(param, "sequence_parallel", False) and ps.get_tensor_model_parallel_world_size() > 1:
            dist.all_reduce(param.grad, group=ps.get_tensor_model_parallel_group())


def global_grad_norm(model: torch.nn.Module) -> float:
    """L2 norm of the whole model's gradient: each tensor-parallel shard once, replicated tensors once, summed
    over the model-parallel ranks (dense: TP x PP; experts: ETP x EP x PP). Every rank gets the same value."""
    from megatron.core import parallel_state as ps

    device = collective_device(dist.get_backend()) if dist.is_initialized() else torch.device("cpu")
    dense = torch.zeros((), dtype=torch.float64, device=device)
    expert = torch.zeros((), dtype=torch.float64, device=device)
    for name, param in model.named_parameters():
        if param.grad is None:
            continue
        _, tp_rank, _ = _param_groups(name)
        if getattr(param, "tensor_model_parallel", False) or tp_rank == 0:
            sq = param.grad.detach().double().pow(2).sum().to(device)
            if is_expert(name):
                expert += sq
            else:
                dense += sq
    if dist.get_world_size() > 1:
        dist.all_reduce(dense, group=ps.get_model_parallel_group())
        dist.all_reduce(expert, group=ps.get_expert_tensor_model_pipeline_parallel_group())
    return float((dense + expert).sqrt())


# ---- full weights <-> this rank's shard --------------------------------------------------------------------

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
_EXPERT = re.compile(r"\.experts\.local_experts\.(\d+)\.")  # SequentialMLP: one module per expert
_GROUPED_EXPERT = re.compile(r"(\.experts\.linear_fc[12]\.weight)(\d+)$")  # grouped GEMM: weight<e>


def full_names(model: torch.nn.Module, expert_rank: int | None = None) -> dict[str, str]:
    """Local state-dict name -> full (world-size-1) name: global layer and expert indices (the experts of EP rank
    ``expert_rank``, default this rank's)."""
    from megatron.core import parallel_state as ps

    layer_numbers = [layer.layer_number - 1 for layer in model.decoder.layers]
    experts = model.config.num_moe_experts or 0
    ep_rank = ps.get_expert_model_parallel_rank() if expert_rank is None else expert_rank
    offset = ep_rank * (experts // ps.get_expert_model_parallel_world_size())
    names = {}
    for name in model.state_dict():
        full = _LAYER.sub(lambda m: f"decoder.layers.{layer_numbers[int(m.group(1))]}.", name)
        full = _EXPERT.sub(lambda m: f".experts.local_experts.{offset + int(m.group(1))}.", full)
        full = _GROUPED_EXPERT.sub(lambda m: f"{m.group(1)}{offset + int(m.group(2))}", full)
        names[name] = full
    return names


def _is_glu(name: str, model: torch.nn.Module) -> bool:
    return name.endswith("linear_fc1.weight") and bool(model.config.gated_linear_unit)


def _shard(full: torch.Tensor, dim: int, glu: bool, rank: int, size: int) -> torch.Tensor:
    if size == 1:
        return full
    if glu:
        gate, up = full.chunk(2, dim=dim)
        return torch.cat([gate.chunk(size, dim=dim)[rank], up.chunk(size, dim=dim)[rank]], dim=dim)
    return full.chunk(size, dim=dim)[rank]


def load_full_weights(model: torch.nn.Module, full_tensor: Callable[[str, tuple[int, ...]], torch.Tensor],
                      source: str = "weights") -> None:
    """Fill this rank's shard from full weights: ``full_tensor(full_name, full_shape)`` returns one (a
    checkpoint lookup, a seeded initialiser). Shapes are checked, naming the tensor. No communication."""
    from megatron.core import parallel_state as ps

    params = dict(model.named_parameters())
    names = full_names(model)
    with torch.no_grad():
        for name, local in model.state_dict().items():
            if not isinstance(local, torch.Tensor) or name.endswith("_extra_state"):
                continue
            param = params.get(name)
            shape = list(local.shape)
            tp_group, tp_rank, _ = _param_groups(name)
            split = param is not None and getattr(param, "tensor_model_parallel", False)
            if split:
                shape[param.partition_dim] *= dist.get_world_size(tp_group)
            full = full_tensor(names[name], tuple(shape))
            if tuple(full.shape) != tuple(shape):
                raise TrainerError(f"{source}: {names[name]} is {tuple(full.shape)}, the model wants {tuple(shape)}")
            if split:
                full = _shard(full, param.partition_dim, _is_glu(name, model), tp_rank, dist.get_world_size(tp_group))
            (param if param is not None else local).copy_(full.to(local.dtype))


# ---- data-parallel replicas -------------------------------------------------------------------------------


def lockstep_over_data_parallel(micros: list, template) -> list:
    """Data-parallel replicas forward their own rows, but expert-parallel all-gathers span replicas and the
    schedule expects one micro-batch count: every replica runs as many micro-batches as the busiest, each
    padded (rows, width) to the largest at its index, with all-padding ones where it has none."""
    from dataclasses import replace

    from megatron.core import parallel_state as ps

    from repro.train.batch import padded_to_shape

    group = ps.get_data_parallel_group()
    if dist.get_world_size(group) == 1:
        return micros
    device = collective_device(dist.get_backend(group))  # NCCL takes device tensors only
    count = torch.tensor([len(micros)], device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX, group=group)
    shapes = torch.zeros((int(count), 2), dtype=torch.int64)
    for i, micro in enumerate(micros):
        shapes[i] = torch.tensor(micro.input_ids.shape)
    shapes = shapes.to(device)
    dist.all_reduce(shapes, op=dist.ReduceOp.MAX, group=group)
    empty = template.rows(slice(0, 0))
    empty = replace(empty, **{f: v[:, :0] if isinstance(v, torch.Tensor) and v.dim() > 1 else v
                              for f, v in vars(empty).items() if f != "routing"},
                    routing=None if empty.routing is None else {k: v[:, :0] for k, v in empty.routing.items()})
    return [padded_to_shape(micros[i] if i < len(micros) else empty, int(r), int(w))
            for i, (r, w) in enumerate(shapes.tolist())]


def sum_over_data_parallel(stats):
    """Add the replicas' sums (each forwarded its own rows); the plan's counts (``UpdateStats.WHOLE_BATCH``) are
    already whole-batch."""
    from megatron.core import parallel_state as ps

    if ps.get_data_parallel_world_size() == 1:
        return stats
    keys = [k for k in vars(stats) if k not in stats.WHOLE_BATCH]
    group = ps.get_data_parallel_group()
    sums = torch.tensor([float(getattr(stats, k)) for k in keys], dtype=torch.float64,
                        device=collective_device(dist.get_backend(group)))
    dist.all_reduce(sums, group=group)
    for key, value in zip(keys, sums.tolist()):
        setattr(stats, key, type(getattr(stats, key))(value))
    return stats


def stage_sender() -> int | None:
    """This rank's sync sender index -- its pipeline stage -- if it leads the stage, else None."""
    from megatron.core import parallel_state as ps

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return 0
    group = ps.get_tensor_and_data_parallel_group(with_context_parallel=True)
    return ps.get_pipeline_model_parallel_rank() if dist.get_rank() == dist.get_global_rank(group, 0) else None


# ---- results that only the last pipeline stage computes ----------------------------------------------------


def from_last_stage(value):
    """``value`` as computed on the last pipeline stage, on every rank of this rank's pipeline (others pass
    None). A pickled broadcast: used for per-step results (log-probs, metrics), not weights."""
    from megatron.core import parallel_state as ps

    if ps.get_pipeline_model_parallel_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=ps.get_pipeline_model_parallel_last_rank(),
                               group=ps.get_pipeline_model_parallel_group())
    return box[0]


class RearmOnBackward(torch.autograd.Function):
    """Identity whose backward first calls ``arm()``: put at a pipeline stage's output, it re-arms routing replay
    for this micro-batch before full recompute re-runs the stage's routers (1F1B interleaves other forwards)."""

    @staticmethod
    def forward(ctx, tensor, arm):
        ctx.arm = arm
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        ctx.arm()
        return grad, None
