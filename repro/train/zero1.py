"""ZeRO stage 1 for the project's AdamW: fp32 masters and Adam moments sharded over the data-parallel ranks.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models" (2020), stage 1
("P_os"): every data-parallel rank keeps the whole model and its whole (already all-reduced) gradient, but the
optimizer state -- here the fp32 master and AdamW's two moments, 12 bytes a parameter -- only for the parameters
it owns, so each rank holds 1/DP of it. Each rank updates what it owns, writes it back into its model in the model's
dtype, then every rank all-gathers the updated parameters. Megatron's distributed optimizer is the same idea over a
flat gradient buffer (it all-gathers BF16 parameters after the sharded step).

Ownership is by whole parameter, balanced greedily by size (what ``torch.distributed.optim.ZeroRedundancyOptimizer``
does), not by flat byte range. The reason is exactness: torch's CPU kernels run a vector loop plus a scalar tail
(``lerp`` uses a fused multiply-add in one and not the other), so AdamW over a slice of a tensor can round
differently from AdamW over the whole tensor. Owning whole tensors makes every rank's update the very operation
the unsharded ``MasterAdamW`` performs, bit for bit (``tests/test_zero1.py`` checks it on two gloo ranks).

``offload=True`` keeps the owned masters and moments in host memory and steps there (what megatron's
``optimizer_cpu_offload`` does with its CPU Adam); on the CPU lane the model already lives in host memory.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from repro.recipes.schema import OptimConfig
from repro.train.optimizer import adamw_groups, clip_to_global_norm, load_masters, masters_by_name, zero_grads


def partition_by_size(sizes: list[int], ranks: int) -> list[int]:
    """Owner rank of each parameter: largest first, each to the rank holding the fewest elements so far (ties to
    the lower rank). Deterministic, so every rank computes the same table. ``sizes``: numel per parameter."""
    load = [0] * ranks
    owner = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(ranks), key=lambda r: (load[r], r))
        owner[index] = rank
        load[rank] += sizes[index]
    return owner


class ShardedMasterAdamW:
    """``MasterAdamW`` with its state sharded over ``group`` (ZeRO-1); the same ``step``/``zero_grad`` contract.

    Every rank of ``group`` must call ``step`` (it all-gathers). Gradients must already be identical on every
    rank of the group (summed over data parallelism), as they are for the unsharded optimizer.

    Args:
        model: this rank's model (its parameters are all updated on every rank after each step).
        optim: the recipe's optimizer section.
        group: the data-parallel process group (None: the default group).
        offload: hold masters and moments in host memory (``cpu``) whatever device the model is on.
        group_of: ``name -> process group`` when parameters replicate over different groups (Megatron: expert
            parameters over the expert-data-parallel group, the rest over the data-parallel one); default ``group``.
            Each group's members must hold the same parameters in the same order (one pipeline stage).
    """

    def __init__(self, model: torch.nn.Module, optim: OptimConfig, group: dist.ProcessGroup | None = None,
                 offload: bool = False, group_of=None):
        self.names = [name for name, _ in model.named_parameters()]
        self.model_params = [p for _, p in model.named_parameters()]
        groups = [group_of(name) if group_of else group for name in self.names]
        # the distinct groups in first-use order: every member of a group calls its all-gather in the same order
        self.groups: list[tuple[dist.ProcessGroup | None, list[int]]] = []
        for index, g in enumerate(groups):
            slot = next((ids for known, ids in self.groups if known is g), None)
            if slot is None:
                self.groups.append((g, [index]))
            else:
                slot.append(index)
        self.owner = [0] * len(self.names)  # each parameter's owner, a rank of its own group
        for g, ids in self.groups:
            for index, rank in zip(ids, partition_by_size([self.model_params[i].numel() for i in ids],
                                                          dist.get_world_size(g))):
                self.owner[index] = rank
        self.owned = [i for i, g in enumerate(groups) if self.owner[i] == dist.get_rank(g)]
        self.owned_names = [self.names[i] for i in self.owned]
        state_device = torch.device("cpu") if offload else None
        self.shares_storage = all(p.dtype == torch.float32 and (state_device is None or p.device == state_device)
                                  for p in self.model_params)
        owned_params = [self.model_params[i] for i in self.owned]
        if self.shares_storage:
            self.master = owned_params
        else:
            self.master = [torch.nn.Parameter(p.detach().to(device=state_device or p.device, dtype=torch.float32,
                                                            copy=True)) for p in owned_params]
        self.grad_clip = optim.grad_clip
        # a rank that owns nothing (more ranks than parameters) still steps an empty optimizer
        empty = [{"params": [torch.nn.Parameter(torch.zeros(0))]}]
        groups = adamw_groups(self.owned_names, self.master, optim) or empty
        self.optimizer = torch.optim.AdamW(groups, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps,
                                           weight_decay=optim.weight_decay)

    def zero_grad(self) -> None:
        zero_grads(self.model_params)

    def master_grads(self) -> list[torch.Tensor]:
        """The whole model's accumulated gradient in fp32, in ``self.names`` order (every rank holds all of it)."""
        return [p.grad.float() for p in self.model_params]

    def step(self, lr: float, global_norm: float | None = None) -> float:
        """Clip by the global norm, update the owned parameters, all-gather the rest; returns the pre-clip norm.

        The norm is taken over the whole gradient every rank holds, the way ``clip_grad_norm_`` takes it over the
        unsharded masters (``get_total_norm`` of the same fp32 tensors), so clipping scales by the same number.
        """
        owned_grads = [self.model_params[i].grad.float().to(m.device) for i, m in zip(self.owned, self.master)]
        if not self.shares_storage:
            for master, grad in zip(self.master, owned_grads):
                master.grad = grad
        if global_norm is None:
            norm_tensor = torch.nn.utils.get_total_norm(self.master_grads())
            norm = float(norm_tensor)
            if self.master:
                torch.nn.utils.clip_grads_with_norm_(self.master, self.grad_clip, norm_tensor)
        else:
            norm = global_norm
            clip_to_global_norm(self.master, self.grad_clip, norm)
        if math.isfinite(norm):
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            if self.master:
                self.optimizer.step()
            with torch.no_grad():
                if not self.shares_storage:
                    for i, master in zip(self.owned, self.master):
                        self.model_params[i].copy_(master.to(self.model_params[i].dtype))
                self._all_gather_parameters()
        self.zero_grad()
        return norm

    def _all_gather_parameters(self) -> None:
        for group, ids in self.groups:
            self._all_gather(group, ids)

    def _all_gather(self, group: dist.ProcessGroup | None, ids: list[int]) -> None:
        """Every rank of ``group`` sends the bytes of the parameters (of ``ids``) it owns; each writes the others'.

        Raw bytes (a ``uint8`` view) travel, so any dtype goes through gloo unchanged; shards are padded to the
        largest one because ``all_gather`` needs equal sizes."""
        world, me = dist.get_world_size(group), dist.get_rank(group)
        if world == 1:
            return
        by_rank = [[i for i in ids if self.owner[i] == rank] for rank in range(world)]
        nbytes = [sum(self.model_params[i].numel() * self.model_params[i].element_size() for i in part)
                  for part in by_rank]
        width = max(nbytes)
        device = self.model_params[0].device
        mine = torch.zeros(width, dtype=torch.uint8, device=device)
        offset = 0
        for i in by_rank[me]:
            flat = _bytes(self.model_params[i])
            mine[offset:offset + flat.numel()] = flat
            offset += flat.numel()
        gathered = [torch.empty(width, dtype=torch.uint8, device=device) for _ in range(world)]
        dist.all_gather(gathered, mine, group=group)
        for rank, part in enumerate(by_rank):
            if rank == me:
                continue
            offset = 0
            for i in part:
                target = _bytes(self.model_params[i])
                target.copy_(gathered[rank][offset:offset + target.numel()])
                offset += target.numel()

    def master_state(self) -> dict[str, torch.Tensor]:
        """name -> fp32 master of the parameters this rank owns; empty when the owned parameters are the masters."""
        return masters_by_name(self.owned_names, self.master, self.shares_storage)

    def load_master_state(self, state: dict[str, torch.Tensor]) -> None:
        load_masters(self.owned_names, self.master, state)

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds: its masters (when they are copies) and both moments."""
        moments = sum(t.numel() * t.element_size() for s in self.optimizer.state.values()
                      for key, t in s.items() if key in ("exp_avg", "exp_avg_sq"))
        masters = 0 if self.shares_storage else sum(m.numel() * m.element_size() for m in self.master)
        return moments + masters


def _bytes(param: torch.Tensor) -> torch.Tensor:
    """A flat ``uint8`` view of a contiguous parameter's storage (writes go to the parameter)."""
    return param.data.view(-1).view(torch.uint8)
