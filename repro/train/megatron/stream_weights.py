"""A Megatron pipeline stage's full weights, streamed to the stage's first rank one tensor at a time with tensor
collectives: what the weight sync sends (every stage its own layers), and the stages joined for ``named_weights``.

Every rank of a stage walks the stage's tensors in one order -- its local state-dict names, which all ranks of a
stage share (layers and experts are numbered locally) -- and per tensor:

  dense   the tensor-parallel shards are gathered (``dist.gather``) to TP rank 0 of data/context-parallel replica 0,
          which is the stage's first rank (megatron numbers TP fastest, then CP, EP, DP); other replicas skip it;
  expert  the expert-TP shards are gathered to ETP rank 0 of expert-data-parallel replica 0, then those ranks --
          one per EP rank, all holding local expert i at the same shape -- gather it to the stage's first rank.

Full tensors exist only on the stage's first rank, which yields ``(served name, tensor)`` and drops each before the
next; the others yield nothing. Nothing is pickled: shards travel as tensors, and between stages
(``whole_model_weights``) each tensor follows a JSON header sent as bytes.

``export_names`` (megatron -> served names, ``dict -> dict``) is applied per *export unit*, the smallest set of
tensors the served layout needs together: one layer's experts of one projection (a served layout may stack them
into one ``[E, ...]`` tensor), one layer's other tensors (a norm that megatron names twice maps to one served
tensor), each top-level tensor alone. The first rank's peak extra memory is one unit, its export's copy and the
sync's buckets -- not the stage.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.distributed as dist

from repro.devices import collective_device
from repro.sync.stream import WIRE_DTYPES
from repro.train.base import TrainerError
from repro.train.megatron.parallel import _is_glu, _param_groups, full_names, is_expert, stage_sender

Export = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]

_LOCAL_LAYER = re.compile(r"^(decoder\.layers\.\d+\.)")
_LOCAL_EXPERT = re.compile(r"(\.experts\.local_experts\.)\d+(\.)|(\.experts\.linear_fc[12]\.weight)\d+$")


def export_unit(local_name: str) -> str:
    """The export unit of a local state-dict name: names that ``export_names`` must see together share it."""
    if is_expert(local_name):
        return _LOCAL_EXPERT.sub(lambda m: f"{m.group(1)}*{m.group(2)}" if m.group(1) else f"{m.group(3)}*", local_name)
    layer = _LOCAL_LAYER.match(local_name)
    return layer.group(1) if layer else local_name


def stream_order(names: list[str], grouped: bool) -> list[list[str]]:
    """``names`` (state-dict order) cut into units, each unit where its first member stands; one name per unit
    when nothing needs grouping. Pure: every rank of a stage computes the same list from the same names."""
    if not grouped:
        return [[name] for name in names]
    units: dict[str, list[str]] = {}
    for name in names:
        units.setdefault(export_unit(name), []).append(name)
    return list(units.values())


@dataclass(frozen=True)
class _StageRanks:
    leader: int            # global rank of the stage's first rank: it receives every full tensor
    dense: bool            # this rank takes part in the dense TP gathers (data/context-parallel replica 0)
    experts: bool          # this rank takes part in the expert-TP gathers (expert-data-parallel replica 0)
    ep_group: object       # the EP group of ETP rank 0, replica 0 (which holds the leader), else None
    ep_rank: int
    ep_size: int


def _stage_ranks() -> _StageRanks | None:
    """Who does what in this rank's stage; None in a one-process world (no communication at all)."""
    from megatron.core import parallel_state as ps

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    leader = dist.get_global_rank(ps.get_tensor_and_data_parallel_group(with_context_parallel=True), 0)
    dense = ps.get_data_parallel_rank(with_context_parallel=True) == 0
    experts = ps.get_expert_data_parallel_rank() == 0
    sends_experts = experts and ps.get_expert_tensor_parallel_rank() == 0
    ep_group = ps.get_expert_model_parallel_group() if sends_experts else None
    if dist.get_rank() == leader and not (dense and sends_experts and ps.get_tensor_model_parallel_rank() == 0
                                          and ps.get_expert_model_parallel_rank() == 0):
        raise TrainerError("weight stream: the stage's first rank is not TP/ETP/EP rank 0 of replica 0 -- "
                           "megatron's rank order must put tensor parallelism first (order 'tp-cp-ep-dp-pp')")
    return _StageRanks(leader, dense, experts, ep_group, ps.get_expert_model_parallel_rank(),
                       ps.get_expert_model_parallel_world_size())


def _gather_shards(local: torch.Tensor, dim: int, glu: bool, group) -> torch.Tensor | None:
    """The full tensor on the group's rank 0 (its shards joined along ``dim``; a gated fc1's [gate_r; up_r]
    blocks regrouped as [all gates; all ups]), None on the others."""
    size = dist.get_world_size(group)
    if size == 1:
        return local
    dst = dist.get_global_rank(group, 0)
    local = local.contiguous()
    if dist.get_rank() != dst:
        dist.gather(local, None, dst=dst, group=group)
        return None
    if dim == 0 and not glu:  # shards land in place: no second copy of the tensor
        full = local.new_empty((local.shape[0] * size, *local.shape[1:]))
        dist.gather(local, list(full.chunk(size)), dst=dst, group=group)
        return full
    pieces = [torch.empty_like(local) for _ in range(size)]
    dist.gather(local, pieces, dst=dst, group=group)
    if glu:
        halves = [p.chunk(2, dim=dim) for p in pieces]
        pieces = [h[0] for h in halves] + [h[1] for h in halves]
    return torch.cat(pieces, dim=dim)


def _full_tensors(name: str, tensor: torch.Tensor, param, glu: bool, ranks: _StageRanks | None,
                  names_by_ep: list[dict[str, str]]) -> list[tuple[str, torch.Tensor, bool]]:
    """(full name, full tensor, whether it is a new tensor rather than the model's own) of the local tensor
    ``name`` on the stage's first rank -- one per EP rank for an expert -- and [] elsewhere. Collective over the
    stage's ranks that hold a shard of it."""
    if ranks is None:
        return [(names_by_ep[0][name], tensor.detach(), False)]
    expert = is_expert(name)
    if not (ranks.experts if expert else ranks.dense):
        return []
    full, gathered = tensor.detach(), False
    if param is not None and getattr(param, "tensor_model_parallel", False):
        tp_group, _, _ = _param_groups(name)
        gathered = dist.get_world_size(tp_group) > 1
        full = _gather_shards(full, param.partition_dim, glu, tp_group)
        if full is None:
            return []
    if not expert or ranks.ep_size == 1:
        return [(names_by_ep[ranks.ep_rank][name], full, gathered)] if dist.get_rank() == ranks.leader else []
    full = full.contiguous()
    if dist.get_rank() != ranks.leader:
        dist.gather(full, None, dst=ranks.leader, group=ranks.ep_group)
        return []
    every = [torch.empty_like(full) for _ in range(ranks.ep_size)]
    dist.gather(full, every, dst=ranks.leader, group=ranks.ep_group)
    return [(names_by_ep[r][name], t, True) for r, t in enumerate(every)]


def stage_weights(model: torch.nn.Module, dtype: torch.dtype, export_names: Export | None = None
                  ) -> Iterator[tuple[str, torch.Tensor]]:
    """This stage's full weights on its first rank, one at a time: detached tensors of their own (floating ones in
    ``dtype``) on the device the model lives on -- a GPU trainer's sync packs and sends them there without a host
    round trip -- names mapped by ``export_names`` per export unit; nothing on the other ranks. Collective: every
    rank of the stage calls it and walks it to the end."""
    ranks = _stage_ranks()
    names_by_ep = [full_names(model, expert_rank=r) for r in range(ranks.ep_size if ranks is not None else 1)]
    state = {n: t for n, t in model.state_dict().items()
             if isinstance(t, torch.Tensor) and not n.endswith("_extra_state")}
    params = dict(model.named_parameters())
    for unit in stream_order(list(state), grouped=export_names is not None):
        full: dict[str, torch.Tensor] = {}
        for name in unit:
            for full_name, tensor, new in _full_tensors(name, state[name], params.get(name), _is_glu(name, model),
                                                        ranks, names_by_ep):
                to = dtype if tensor.is_floating_point() else tensor.dtype
                full[full_name] = tensor.to(dtype=to, copy=not new)  # never the live parameter
        if not full:
            continue
        mapped = export_names(full) if export_names is not None else full
        del full
        for key in list(mapped):
            yield key, mapped.pop(key)  # dropped here once the consumer lets go of it


# ---- every stage on the first rank (checkpoint export, tests): tensors after JSON headers, no pickle ----------

def _transport_device() -> torch.device:
    """Point-to-point buffers live where the backend can send them: the GPU under NCCL, else host memory."""
    return collective_device(dist.get_backend())


def _send_named(name: str, tensor: torch.Tensor, dst: int) -> None:
    header = json.dumps({"name": name, "dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape)})
    data = torch.frombuffer(bytearray(header.encode()), dtype=torch.uint8)
    device = _transport_device()
    dist.send(torch.tensor([data.numel()], device=device), dst)
    dist.send(data.to(device), dst)
    dist.send(tensor.contiguous().to(device), dst)


def _send_end(dst: int) -> None:
    dist.send(torch.tensor([0], device=_transport_device()), dst)


def _receive_stage(src: int) -> Iterator[tuple[str, torch.Tensor]]:
    """What ``_send_named`` sent from ``src``, up to its end marker, as CPU tensors."""
    device = _transport_device()
    while True:
        length = torch.zeros(1, dtype=torch.int64, device=device)
        dist.recv(length, src)
        if int(length) == 0:
            return
        data = torch.empty(int(length), dtype=torch.uint8, device=device)
        dist.recv(data, src)
        header = json.loads(bytes(data.cpu().tolist()))
        if header["dtype"] not in WIRE_DTYPES:
            raise TrainerError(f"weight stream from rank {src}: tensor {header['name']} "
                               f"has unknown dtype {header['dtype']}")
        tensor = torch.empty(header["shape"], dtype=WIRE_DTYPES[header["dtype"]], device=device)
        dist.recv(tensor, src)
        yield header["name"], tensor.cpu()


def whole_model_weights(model: torch.nn.Module, dtype: torch.dtype, export_names: Export | None = None
                        ) -> Iterator[tuple[str, torch.Tensor]]:
    """Every stage's ``stage_weights`` on global rank 0, stage after stage (each later stage's first rank sends
    its tensors point to point), nothing elsewhere; host tensors (for a checkpoint export). Collective: every rank
    calls it and walks it to the end."""
    from megatron.core import parallel_state as ps

    own = stage_weights(model, dtype, export_names)
    stages = ps.get_pipeline_model_parallel_world_size() if dist.is_initialized() else 1
    if stages == 1:
        yield from ((name, tensor.cpu()) for name, tensor in own)
        return
    if dist.get_rank() == 0:  # its pipeline group holds every stage's first rank
        yield from ((name, tensor.cpu()) for name, tensor in own)
        for stage in range(1, stages):
            yield from _receive_stage(dist.get_global_rank(ps.get_pipeline_model_parallel_group(), stage))
        return
    leads = stage_sender() is not None  # the other stages' first ranks forward their stage to rank 0
    for name, tensor in own:
        if leads:
            _send_named(name, tensor, 0)
    if leads:
        _send_end(0)
