"""The Megatron trainer's optimizer, chosen in one place (``trainer_optimizer``) by whether a GPU is present.

  GPU (CUDA/ROCm)  ``MegatronAdamW``: megatron-core's own -- the model wrapped in megatron's
                   ``DistributedDataParallel`` (fp32 gradient buffers), ``get_megatron_optimizer`` with the recipe's
                   ``OptimizerConfig`` (``repro.train.megatron.config.optimizer_config``: the distributed optimizer
                   above one worker, CPU offload through ``HybridDeviceOptimizer`` with
                   ``optimizer_offload_fraction``, BF16 moments on the precision-aware path), gradients finished by
                   ``finalize_model_grads`` (DP reduce-scatter, sequence-parallel norm grads over TP), clipped and
                   stepped by megatron, checkpointed by its ``sharded_state_dict``.
  CPU              ``ProjectAdamW``: the project's fp32-master AdamW (``repro.train.optimizer.MasterAdamW``),
                   ZeRO-1-sharded over data-parallel replicas when distributed (``repro.train.zero1``), gradients
                   reduced and the clip norm taken by ``repro.train.megatron.parallel``.

Why the device and not a recipe field: megatron-core 0.16.1's optimizers cannot be built without CUDA at all
(``FP32Optimizer``/``DistributedOptimizer`` allocate ``device="cuda"`` tensors and accept only ``torch.cuda.*``
parameter types; ``HybridDeviceOptimizer`` opens CUDA streams), and on a GPU the project's optimizer has no reason
to exist (no offload overlap, no flat buffers). A field could only name a combination that fails; the recipe
already says what matters (distributed, offload, fraction, moment dtype) and both sides read it.

Both classes have one contract: ``names``, ``zero_grad()``, ``master_grads()``, ``step(lr) -> pre-clip norm``
(a non-finite norm skips the update), ``adam_step()``, ``sharded_state_dict(model_sd, is_loading, adam_step)``
and ``load_sharded_state_dict(state, adam_step)`` for ``repro.train.megatron.dist_state``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from repro.devices import collective_device
from repro.recipes.backends import TRANSFORMER_ENGINE
from repro.recipes.schema import OptimConfig
from repro.train.base import TrainerError
from repro.train.megatron.parallel import global_grad_norm, is_expert, reduce_gradients
from repro.train.optimizer import MasterAdamW, group_weight_decay, load_masters
from repro.train.zero1 import ShardedMasterAdamW

# megatron's distributed-optimizer checkpoint layout. 'fully_reshardable' stores each parameter's optimizer state
# (fp32 master, exp_avg, exp_avg_sq) shaped like the parameter, so it loads onto any TP/PP/EP/DP layout; the
# 'dp_reshardable' format stores the optimizer's flat buffers and reshards "only in DP dimension"
# (megatron-core 0.16.1 distrib_optimizer.py, DistributedOptimizer.sharded_state_dict's docstring; the formats that
# reshard fully are its checkpoint_fully_reshardable_formats). The cost: on save the DP replicas' shards are
# all-gathered (nothing to gather at AMD's DP 1).
DISTRIB_OPTIM_SHARDING = {"distrib_optim_sharding_type": "fully_reshardable"}


def trainer_optimizer(model: torch.nn.Module, optim: OptimConfig, *, distributed: bool, offload: bool,
                      megatron_optimizer: dict[str, Any], megatron_ddp: dict[str, Any],
                      on_gpu: bool | None = None):
    """The optimizer of this trainer rank (see the module docstring); ``on_gpu`` defaults to whether torch sees a
    CUDA/ROCm device. ``megatron_optimizer`` / ``megatron_ddp``: ``OptimizerConfig`` /
    ``DistributedDataParallelConfig`` keyword arguments (``megatron_layout(recipe)``)."""
    if torch.cuda.is_available() if on_gpu is None else on_gpu:
        return MegatronAdamW(model, megatron_optimizer, megatron_ddp, weight_decay_rule=optim.weight_decay_rule)
    if not distributed:
        return ProjectAdamW(model, MasterAdamW(model, optim), owned=None)
    from megatron.core import parallel_state as ps

    dense, experts = ps.get_data_parallel_group(), ps.get_expert_data_parallel_group()
    inner = ShardedMasterAdamW(model, optim, offload=offload,
                               group_of=lambda name: experts if is_expert(name) else dense)
    return ProjectAdamW(model, inner, owned=inner.owned)


def _sharded_params(model: torch.nn.Module, model_sd: dict) -> dict[str, Any]:
    """name -> the ShardedTensor (or factory) megatron's ``sharded_state_dict`` made of that very parameter."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.utils import extract_sharded_tensors_and_factories

    by_id = {id(t.data): t for t in nested_values(extract_sharded_tensors_and_factories(model_sd)[0])}
    found = {name: by_id.get(id(p)) for name, p in model.named_parameters()}
    missing = [name for name, t in found.items() if t is None]
    if missing:
        raise TrainerError(f"the model's sharded_state_dict does not hold parameters {missing[:3]}")
    return found


def _main_replica(sharded):
    """The same shard, marked as the one copy that is written: a ZeRO-1 owner holds the only optimizer state of a
    parameter its data-parallel replicas also hold (megatron puts the DP rank last in ``replica_id``)."""
    rid = sharded.replica_id
    return replace(sharded, replica_id=(*rid[:-1], 0) if isinstance(rid, tuple) else 0)


class ProjectAdamW:
    """The CPU lane's optimizer: ``inner`` (``MasterAdamW``, or ``ShardedMasterAdamW`` owning ``owned``) plus the
    trainer's own gradient reduction and global clip norm, and its state as megatron sharded tensors."""

    checkpoint_format = "per_parameter"  # each state tensor sharded as its parameter: reshards onto any layout

    def __init__(self, model: torch.nn.Module, inner: MasterAdamW | ShardedMasterAdamW, owned: list[int] | None):
        self.model, self.inner = model, inner
        self.names = inner.names
        self.owned = list(range(len(self.names))) if owned is None else owned
        self.zero1 = owned is not None

    def zero_grad(self) -> None:
        self.inner.zero_grad()

    def master_grads(self) -> list[torch.Tensor]:
        return self.inner.master_grads()

    def step(self, lr: float) -> float:
        reduce_gradients(self.model)
        return self.inner.step(lr, global_norm=global_grad_norm(self.model))

    def adam_step(self) -> float:
        """AdamW's step count (every parameter shares it; collective: a rank that owns nothing reads it elsewhere)."""
        steps = [float(s["step"]) for s in self.inner.optimizer.state.values() if "step" in s]
        if len(set(steps)) > 1:
            raise TrainerError(f"AdamW state has differing step counts {sorted(set(steps))}")
        distributed = dist.is_initialized() and dist.get_world_size() > 1
        local = torch.tensor([steps[0] if steps else 0.0], dtype=torch.float64,
                             device=collective_device(dist.get_backend()) if distributed else "cpu")
        if distributed:
            dist.all_reduce(local, op=dist.ReduceOp.MAX)
        return float(local)

    def sharded_state_dict(self, model_sd: dict, is_loading: bool = False, adam_step: float | None = None) -> dict:
        """Masters (when they are copies) and moments of the owned parameters, each sharded as its parameter."""
        from megatron.core.dist_checkpointing.optimizer import make_sharded_optimizer_tensor

        sharded = _sharded_params(self.model, model_sd)
        has_moments = (adam_step or 0) > 0 if is_loading else self.adam_step() > 0
        out = {}
        for index, master in zip(self.owned, self.inner.master):
            name = self.names[index]
            fields = {} if self.inner.shares_storage else {"master": master}
            if has_moments:
                state = self.inner.optimizer.state.get(master, {})
                for field in ("exp_avg", "exp_avg_sq"):
                    fields[field] = torch.empty_like(master) if is_loading else state[field]
            param = _main_replica(sharded[name]) if self.zero1 else sharded[name]
            out[name] = {field: make_sharded_optimizer_tensor(param, t, f"optimizer.{field}")
                         for field, t in fields.items()}
        return out

    def load_sharded_state_dict(self, state: dict, adam_step: float) -> None:
        owned_names = [self.names[i] for i in self.owned]
        if not self.inner.shares_storage:
            load_masters(owned_names, self.inner.master, {name: state[name]["master"] for name in owned_names})
        if adam_step > 0 and self.inner.master:
            step = torch.tensor(adam_step, dtype=torch.float32)
            # torch numbers the state by position across the param groups (one per weight decay), not by name
            slot_of = {id(p): slot for slot, p in enumerate(p for g in self.inner.optimizer.param_groups
                                                            for p in g["params"])}
            moments = {slot_of[id(master)]: {"step": step.clone(), "exp_avg": state[name]["exp_avg"],
                                             "exp_avg_sq": state[name]["exp_avg_sq"]}
                       for master, name in zip(self.inner.master, owned_names)}
            groups = self.inner.optimizer.state_dict()["param_groups"]
            self.inner.optimizer.load_state_dict({"state": moments, "param_groups": groups})


class MegatronAdamW:
    """megatron-core's optimizer on a GPU rank (see the module docstring). Not constructible on CPU."""

    checkpoint_format = DISTRIB_OPTIM_SHARDING["distrib_optim_sharding_type"]

    def __init__(self, model: torch.nn.Module, optimizer_kwargs: dict[str, Any], ddp_kwargs: dict[str, Any],
                 weight_decay_rule: str = "megatron"):
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        if optimizer_kwargs.get("use_precision_aware_optimizer") and importlib.util.find_spec(
                "transformer_engine") is None:
            raise TrainerError(f"{TRANSFORMER_ENGINE.what}; it is not installed here (module transformer_engine): "
                               "use an image with it (AMD's and NVIDIA's Megatron images have it), or turn "
                               "actor.optimizer_cpu_offload off and set actor.optimizer_moment_dtype=fp32")
        self.model = model
        # the hooks DDP puts on each parameter move its gradient into the fp32 buffer, whichever module runs forward
        self.ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(**ddp_kwargs), model)
        self.optimizer = get_megatron_optimizer(OptimizerConfig(**optimizer_kwargs), [self.ddp])
        self.names = [name for name, _ in model.named_parameters()]
        self.model_params = [p for _, p in model.named_parameters()]
        self.weight_decay, self.weight_decay_rule = float(optimizer_kwargs.get("weight_decay", 0.0)), weight_decay_rule

    def zero_grad(self) -> None:
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()

    def master_grads(self) -> list[torch.Tensor]:
        """Each parameter's accumulated gradient (its slice of DDP's fp32 buffer), before the reduction."""
        return [p.main_grad.float() for p in self.model_params]

    def step(self, lr: float) -> float:
        """Reduce (``finalize_model_grads``, no token count: each loss is already its share), then megatron clips by
        the global norm and steps; returns the norm megatron's ``step()`` took (megatron-core 0.16.1 fills the main
        params' gradients only inside ``step()`` -> ``prepare_grads``, so a norm asked for before it is 0).

        A NaN/Inf anywhere in the gradient skips the update on every rank, as the CPU optimizer does: megatron would
        not (without a grad scaler, BF16's case, ``step()`` clips by a NaN norm -- a no-op -- and applies it), so the
        DDP gradient buffers are checked first (``_gradient_is_finite``) and the non-finite norm is reported as NaN.

        Each group's weight decay is set here as megatron's ``OptimizerParamScheduler`` sets it (LumenRL's engine
        builds one): ``weight_decay * wd_mult`` under rule ``megatron`` -- megatron's groups give biases and 1-D
        parameters ``wd_mult`` 0 -- else ``weight_decay``; without it every group keeps the config's decay.
        """
        from megatron.core.distributed import finalize_model_grads

        finalize_model_grads([self.ddp])
        for group in self.optimizer.param_groups:  # what megatron's OptimizerParamScheduler sets on each step
            group["lr"] = lr
            group["weight_decay"] = group_weight_decay(self.weight_decay, group, self.weight_decay_rule)
        norm = float("nan")
        if self._gradient_is_finite():
            ok, grad_norm, _ = self.optimizer.step()
            norm = float(grad_norm) if ok and grad_norm is not None else float("nan")
        self.zero_grad()
        return norm

    def _gradient_is_finite(self) -> bool:
        """Whether every rank's DDP gradient buffers (dense and expert) hold only finite values (collective)."""
        buffers = [b.grad_data for b in self.ddp.buffers + self.ddp.expert_parallel_buffers]
        distributed = dist.is_initialized() and dist.get_world_size() > 1
        device = collective_device(dist.get_backend()) if distributed else (buffers[0].device if buffers else "cpu")
        bad = torch.zeros((), dtype=torch.int64, device=device)
        for grads in buffers:
            bad += (~torch.isfinite(grads)).any().to(device)
        if distributed:
            dist.all_reduce(bad)
        return int(bad) == 0

    def adam_step(self) -> None:
        return None  # megatron's sharded optimizer state carries its own step

    def sharded_state_dict(self, model_sd: dict, is_loading: bool = False, adam_step: float | None = None) -> dict:
        return self.optimizer.sharded_state_dict(model_sd, is_loading=is_loading, metadata=DISTRIB_OPTIM_SHARDING)

    def load_sharded_state_dict(self, state: dict, adam_step: float | None) -> None:
        self.optimizer.load_state_dict(state)
