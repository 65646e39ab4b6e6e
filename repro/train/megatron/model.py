"""What the trainer needs of a megatron-core model: its MoE routers (for R3), a forward to logits, routing
recorded by its own routers, and its weights as a plain state dict."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from repro.train.base import TrainerError


def detach_from_global_replay_list(model: torch.nn.Module) -> None:
    """Drop this model's routers from megatron's process-global ``RouterReplay`` list (the trainer drives each
    instance itself; the global list would otherwise mix every model built in the process)."""
    from megatron.core.transformer.moe.router_replay import RouterReplay

    mine = {id(m.router_replay) for m in model.modules() if getattr(m, "router_replay", None) is not None}
    RouterReplay.global_router_replay_instances[:] = [
        r for r in RouterReplay.global_router_replay_instances if id(r) not in mine
    ]


@dataclass
class _Router:
    """One top-k MoE router of the model: what ``check_batch`` reads (``top_k``) plus the megatron module."""

    module: torch.nn.Module
    top_k: int
    num_experts: int


def moe_routers(model: torch.nn.Module) -> dict[int, _Router]:
    """Global layer index (0-based) -> top-k router of every MoE layer with routing replay enabled."""
    from megatron.core.transformer.moe.router import TopKRouter

    routers = {}
    for layer in model.decoder.layers:
        router = getattr(getattr(layer, "mlp", None), "router", None)
        if isinstance(router, TopKRouter):
            if router.router_replay is None:
                raise TrainerError(f"layer {layer.layer_number - 1}: router built without moe_enable_routing_replay")
            routers[layer.layer_number - 1] = _Router(router, router.topk, router.config.num_moe_experts)
    if not routers:
        raise TrainerError(f"{type(model).__name__} has no megatron TopKRouter (no MoE layer to route)")
    return routers


def _model_inputs(input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    rows, width = input_ids.shape
    position_ids = torch.arange(width, device=input_ids.device).unsqueeze(0).expand(rows, width)
    # megatron's default causal mask is allocated on "cuda"; an explicit one (True = masked) works anywhere
    causal = torch.triu(torch.ones(width, width, dtype=torch.bool, device=input_ids.device), diagonal=1)
    return {"input_ids": input_ids, "position_ids": position_ids, "attention_mask": causal[None, None]}


def forward_logits(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """[B, T, V] logits of a megatron ``GPTModel`` (causal, positions 0..T-1)."""
    return model(**_model_inputs(input_ids))


def sequence_first(table: torch.Tensor, sequence_parallel: bool) -> torch.Tensor:
    """[B, T, k] -> megatron's [T * B, k] token order, this rank's sequence chunk under sequence parallelism."""
    from megatron.core import parallel_state

    k = table.shape[-1]
    per_token = table.transpose(0, 1)
    tp = parallel_state.get_tensor_model_parallel_world_size()
    if sequence_parallel and tp > 1:
        # under SP each TP rank routes its own T/tp slice of the sequence (untested at world size 1)
        per_token = per_token.chunk(tp, dim=0)[parallel_state.get_tensor_model_parallel_rank()]
    return per_token.reshape(-1, k).contiguous()


def record_routing(model: torch.nn.Module, input_ids: torch.Tensor) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """One forward with every router recording: ([B, T, V] logits, layer -> [B, T, top_k] int64 experts)."""
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    routers = moe_routers(model)
    for r in routers.values():
        r.module.router_replay.clear_indices()
        r.module.router_replay.set_router_replay_action(RouterReplayAction.RECORD)
    try:
        logits = forward_logits(model, input_ids)
        rows, width = input_ids.shape
        indices = {}
        for layer, r in routers.items():
            recorded = r.module.router_replay.get_recorded_indices()
            indices[layer] = recorded.detach().view(width, rows, -1).transpose(0, 1).to(torch.int64).contiguous()
    finally:
        for r in routers.values():
            r.module.router_replay.clear_router_replay_action()
            r.module.router_replay.clear_indices()
    return logits, indices


def weight_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict without megatron's ``_extra_state`` entries (None or bytes, not weights)."""
    return {k: v for k, v in model.state_dict().items()
            if isinstance(v, torch.Tensor) and not k.endswith("_extra_state")}


def load_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], source: str = "weights") -> None:
    """Load ``weight_state``-style tensors into ``model``: every weight must be present and known."""
    missing = sorted(set(weight_state(model)) - set(weights))
    unknown = sorted(set(weights) - set(weight_state(model)))
    if missing or unknown:
        raise TrainerError(f"{source} does not fit the model: missing {missing[:3]}, unknown {unknown[:3]}")
    try:
        model.load_state_dict(weights, strict=False)
    except RuntimeError as err:
        raise TrainerError(f"{source} does not fit the model: {err}") from err


# ---- the trainer -------------------------------------------------------------------------------------------
