"""AdamW with fp32 master weights, a constant learning rate with linear warm-up, and global-norm clipping.

In fp32 the master weights are the model's own parameters. In bf16 the model computes in bf16 while AdamW
updates fp32 copies that are written back after each update -- what Megatron's mixed-precision optimizer does;
an AdamW step of lr=1e-6 applied to bf16 weights directly (8 mantissa bits) would round away entirely.
"""

from __future__ import annotations

import math

import torch

from repro.recipes.schema import OptimConfig


def warmup_constant_lr(optim: OptimConfig, update_index: int) -> float:
    """lr of update ``update_index`` (0-based): ramps linearly over ``warmup_steps`` updates, then constant.

    The first warm-up update already uses lr / warmup_steps (HF's schedule spends its first update at lr 0).
    """
    if optim.warmup_steps <= 0:
        return optim.lr
    return optim.lr * min(1.0, (update_index + 1) / optim.warmup_steps)


def decays(name: str, param: torch.Tensor, rule: str) -> bool:
    """Whether ``weight_decay`` applies to the parameter: every one under rule ``all``; under ``megatron`` all but
    biases and 1-D parameters (megatron-core ``_get_param_groups``' default: ``name.endswith(".bias")`` or one
    dimension gives ``wd_mult`` 0, which the ``OptimizerParamScheduler`` multiplies into each group's decay)."""
    if rule == "all":
        return True
    if rule == "megatron":
        return not (name.endswith(".bias") or param.dim() == 1)
    raise ValueError(f"optim.weight_decay_rule must be 'megatron' or 'all', got {rule!r}")


def adamw_groups(names: list[str], params: list[torch.Tensor], optim: OptimConfig) -> list[dict]:
    """AdamW parameter groups, one per distinct weight decay (in first-use order, parameters in name order inside
    each): a single group when every parameter decays alike, as AdamW with one ``weight_decay`` would build."""
    groups: dict[float, list[torch.Tensor]] = {}
    for name, param in zip(names, params):
        groups.setdefault(optim.weight_decay if decays(name, param, optim.weight_decay_rule) else 0.0, []).append(param)
    return [{"params": members, "weight_decay": decay} for decay, members in groups.items()]


def group_weight_decay(weight_decay: float, group: dict, rule: str) -> float:
    """The decay of one of megatron's optimizer param groups, as its ``OptimizerParamScheduler`` sets it: the
    group's ``wd_mult`` (0 for biases and 1-D parameters, 1 otherwise) times ``weight_decay`` under rule
    ``megatron``; ``weight_decay`` for every group under ``all``."""
    if rule not in ("megatron", "all"):
        raise ValueError(f"optim.weight_decay_rule must be 'megatron' or 'all', got {rule!r}")
    return weight_decay * float(group.get("wd_mult", 1.0)) if rule == "megatron" else weight_decay


class MasterAdamW:
    """AdamW over fp32 masters of ``model``'s parameters (the parameters themselves when they are fp32); weight
    decay as ``optim.weight_decay_rule`` says (``adamw_groups``)."""

    def __init__(self, model: torch.nn.Module, optim: OptimConfig):
        self.names = [name for name, _ in model.named_parameters()]
        self.model_params = [p for _, p in model.named_parameters()]
        self.shares_storage = all(p.dtype == torch.float32 for p in self.model_params)
        if self.shares_storage:
            self.master = self.model_params
        else:
            self.master = [torch.nn.Parameter(p.detach().float().clone()) for p in self.model_params]
        self.grad_clip = optim.grad_clip
        self.optimizer = torch.optim.AdamW(
            adamw_groups(self.names, self.master, optim), lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps
        )

    def zero_grad(self) -> None:
        zero_grads(self.model_params)

    def master_grads(self) -> list[torch.Tensor]:
        """The accumulated gradient of every parameter, in fp32, in ``self.names`` order."""
        return [p.grad.float() for p in self.model_params]

    def step(self, lr: float, global_norm: float | None = None) -> float:
        """Clip the accumulated gradients to ``grad_clip`` and update; returns the PRE-clip global norm.

        ``global_norm``: the norm of the whole model's gradient when these parameters are one shard of it (a
        model-parallel rank); clipping then scales by it exactly as ``clip_grad_norm_`` does by the local norm.
        A non-finite norm skips the update (as verl does) so one bad batch cannot poison the weights.
        """
        if not self.shares_storage:
            for master, p in zip(self.master, self.model_params):
                master.grad = p.grad.float()
        if global_norm is None:
            norm = float(torch.nn.utils.clip_grad_norm_(self.master, self.grad_clip))
        else:
            norm = global_norm
            clip_to_global_norm(self.master, self.grad_clip, norm)
        if math.isfinite(norm):
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
            if not self.shares_storage:
                with torch.no_grad():
                    for master, p in zip(self.master, self.model_params):
                        p.copy_(master.to(p.dtype))
        self.zero_grad()
        return norm

    def master_state(self) -> dict[str, torch.Tensor]:
        """name -> fp32 master weight; empty when the model's own parameters are the masters."""
        return masters_by_name(self.names, self.master, self.shares_storage)

    def load_master_state(self, state: dict[str, torch.Tensor]) -> None:
        load_masters(self.names, self.master, state)


def clip_to_global_norm(masters: list[torch.Tensor], grad_clip: float, norm: float) -> None:
    """Scale the masters' gradients as ``clip_grad_norm_`` would if their norm were ``norm`` (a whole model's norm
    when these masters are one shard of it); a non-finite norm leaves them (the step is skipped anyway)."""
    coef = min(1.0, grad_clip / (norm + 1e-6)) if math.isfinite(norm) else 1.0
    if coef < 1.0:
        for master in masters:
            master.grad.mul_(coef)


def masters_by_name(names: list[str], masters: list[torch.Tensor], shares_storage: bool) -> dict[str, torch.Tensor]:
    """Copies of the fp32 masters by parameter name; empty when the parameters are their own masters."""
    if shares_storage:
        return {}
    return {name: m.detach().clone() for name, m in zip(names, masters)}


def load_masters(names: list[str], masters: list[torch.Tensor], state: dict[str, torch.Tensor]) -> None:
    """Fill ``masters`` in place from ``state`` (name -> tensor), as ``masters_by_name`` wrote it."""
    with torch.no_grad():
        for name, master in zip(names, masters):
            master.copy_(state[name])


def zero_grads(params: list[torch.Tensor]) -> None:
    """Zeros rather than None: an expert no token reached still takes its AdamW step (momentum, decay), as with
    Megatron's and FSDP's flat gradient buffers, so the update does not depend on routing luck."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        else:
            p.grad.zero_()
