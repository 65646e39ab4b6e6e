"""Routing record and replay (R3) for the top-k MoE layers of one DeepSeek-V4 model instance.

The rollout engine records which experts each token was routed to; the trainer replays exactly those experts
in its own forward, so the policy it differentiates is the one that sampled the tokens, even where the
trainer's numerics would have flipped a near-tie in the router.

How transformers 5.24's ``DeepseekV4TopKRouter`` routes (the replay reproduces it op for op):
``logits = hidden @ W.T`` over ``[batch*seq, hidden]``; ``scores = sqrtsoftplus(logits)`` (config
``scoring_func``); the experts are ``topk(scores + e_score_correction_bias, top_k, sorted=False)`` -- the bias
steers *selection only*; the weights are ``scores.gather(indices)`` renormalised by ``sum + 1e-20`` and
multiplied by ``routed_scaling_factor``. Note that transformers renormalises unconditionally (it does not read
``norm_topk_prob``; the tiny config sets it True, so both agree). Replay keeps the router's own logits (so the
gate weight ``W`` still gets gradients) and swaps only the indices, so replaying a model's own routing gives
bit-identical logits.

Hash-MoE layers (``mlp_layer_types == "hash_moe"``) pick experts by a frozen ``tid2eid[token_id]`` table: the
choice is a function of the token alone and is the same in rollout and training, so they are neither
recorded nor replayed.

Both tools attach forward hooks to the router modules of the one model they are given and remove them on exit;
no class is patched.
"""

from __future__ import annotations

import torch
from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4TopKRouter

from repro.errors import ReproError


class RoutingError(ReproError):
    """Replayed routing does not fit the model or the forward it is applied to."""


def topk_routers(model: torch.nn.Module) -> dict[int, DeepseekV4TopKRouter]:
    """layer index -> top-k router, for every top-k MoE layer of a DeepSeek-V4 model (hash layers excluded)."""
    base = getattr(model, "model", model)
    routers = {i: layer.mlp.gate for i, layer in enumerate(base.layers)
               if isinstance(layer.mlp.gate, DeepseekV4TopKRouter)}
    if not routers:
        raise RoutingError(f"{type(model).__name__} has no DeepseekV4TopKRouter (no top-k MoE layer to route)")
    return routers


def recordable_routers(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """layer index -> top-k router whose choices ``RoutingRecorder`` can record: DeepSeek-V4's, and any
    transformers MoE router at ``layer.mlp.gate`` that returns ``(logits, weights, indices)`` with a ``top_k``
    (Qwen3-MoE's ``Qwen3MoeTopKRouter``, the Megatron CPU lane's rollout model). Replay stays DeepSeek-V4-only."""
    base = getattr(model, "model", model)
    routers = {}
    for i, layer in enumerate(getattr(base, "layers", [])):
        gate = getattr(getattr(layer, "mlp", None), "gate", None)
        if isinstance(gate, DeepseekV4TopKRouter) or (type(gate).__name__.endswith("TopKRouter")
                                                      and hasattr(gate, "top_k")):
            routers[i] = gate
    if not routers:
        raise RoutingError(f"{type(model).__name__} has no top-k MoE router at layers[i].mlp.gate")
    return routers


class LayerHooks:
    """A forward hook on each module of ``_hooked()`` (layer index -> module) while the ``with`` block runs;
    ``_hook(layer)`` makes it. Shared by the routing record/replay here and the indexer's (``indexer_choices``)."""

    _handles: list

    def _hooked(self) -> dict[int, torch.nn.Module]:
        raise NotImplementedError

    def _hook(self, layer: int):
        raise NotImplementedError

    def __enter__(self):
        self._handles = [m.register_forward_hook(self._hook(i)) for i, m in self._hooked().items()]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


class _RouterHooks(LayerHooks):
    """``LayerHooks`` on every top-k router of one model."""

    routers: dict[int, DeepseekV4TopKRouter]

    def _hooked(self) -> dict[int, torch.nn.Module]:
        return self.routers


class RoutingRecorder(_RouterHooks):
    """Records the experts chosen per token by every top-k MoE layer, across one or more forwards.

    ``with RoutingRecorder(model) as rec: model.generate(...)``, then ``rec.indices()`` gives, per layer index,
    an int64 tensor ``[batch, seq, top_k]`` with the forwards concatenated along ``seq`` (prefill, then one
    position per decoding step). With ``generate`` the last sampled token is never fed back, so ``seq`` is the
    total length minus one. Expert order within a token is the router's own (``topk(sorted=False)``).
    """

    def __init__(self, model: torch.nn.Module):
        self.routers = recordable_routers(model)
        base = getattr(model, "model", model)
        # the MoE block sees [batch, seq, hidden]; some routers (Qwen3-MoE) only see the flattened tokens
        self._blocks = {i: base.layers[i].mlp for i in self.routers}
        self._shape: dict[int, tuple[int, int]] = {}
        self._steps: dict[int, list[torch.Tensor]] = {i: [] for i in self.routers}
        self._handles: list = []

    def __enter__(self):
        super().__enter__()
        self._handles += [block.register_forward_pre_hook(self._shape_hook(i)) for i, block in self._blocks.items()]
        return self

    def _shape_hook(self, layer: int):
        def remember(module, args):
            self._shape[layer] = tuple(args[0].shape[:2])

        return remember

    def _hook(self, layer: int):
        def record(module, args, output):
            batch, seq = self._shape[layer]
            self._steps[layer].append(output[2].detach().view(batch, seq, -1).to(torch.int64))

        return record

    def take(self) -> dict[int, torch.Tensor]:
        """layer -> ``[batch, seq, top_k]`` int64 of the one forward run since the start or the last ``take``, and
        forget it: for a caller whose batch changes between forwards (the engine shares and drops rows)."""
        result = {}
        for layer, steps in self._steps.items():
            if len(steps) != 1:
                raise RoutingError(f"layer {layer}: {len(steps)} forwards recorded since the last take, want 1")
            result[layer] = steps.pop()
        return result

    def indices(self) -> dict[int, torch.Tensor]:
        """layer -> ``[batch, seq, top_k]`` int64; raises if a forward changed the batch size mid-record."""
        result = {}
        for layer, steps in self._steps.items():
            if not steps:
                raise RoutingError(f"no forward ran through layer {layer}'s router while recording")
            batches = {s.shape[0] for s in steps}
            if len(batches) != 1:
                raise RoutingError(f"layer {layer}: recorded forwards have different batch sizes {sorted(batches)}")
            result[layer] = torch.cat(steps, dim=1)
        return result


class RoutingReplay(_RouterHooks):
    """Forces the given experts in later forwards while the gate weights stay differentiable.

    ``indices``: layer -> ``[batch, seq, top_k]`` integer tensor (e.g. ``RoutingRecorder.indices()``); every
    top-k layer of the model must be present. Each forward consumes the next ``seq`` positions, so one full
    forward over ``seq`` tokens and a prefill followed by one-token decoding steps both work. The weights of the
    replayed experts are recomputed from this forward's router logits exactly as the native router does.
    """

    def __init__(self, model: torch.nn.Module, indices: dict[int, torch.Tensor]):
        self.routers = topk_routers(model)
        missing = sorted(set(self.routers) - set(indices))
        if missing:
            raise RoutingError(f"replay indices lack top-k MoE layers {missing} (have {sorted(indices)})")
        self.indices = {}
        for layer, router in self.routers.items():
            idx = indices[layer]
            if idx.dim() != 3 or idx.shape[-1] != router.top_k:
                raise RoutingError(f"layer {layer}: replay indices shape {tuple(idx.shape)}, "
                                   f"want [batch, seq, {router.top_k}]")
            if idx.is_floating_point() or idx.min() < 0 or idx.max() >= router.num_experts:
                raise RoutingError(f"layer {layer}: replay indices must be integers in [0, {router.num_experts})")
            self.indices[layer] = idx.to(torch.int64)
        self._cursor = {layer: 0 for layer in self.routers}
        self._handles: list = []

    def _hook(self, layer: int):
        def replay(router, args, output):
            logits = output[0]
            batch, seq = args[0].shape[:2]
            chosen = self.indices[layer]
            start = self._cursor[layer]
            if chosen.shape[0] != batch or start + seq > chosen.shape[1]:
                raise RoutingError(
                    f"layer {layer}: forward needs positions {start}..{start + seq - 1} of batch {batch}, "
                    f"replay indices are {tuple(chosen.shape)}"
                )
            self._cursor[layer] = start + seq
            flat = chosen[:, start : start + seq].reshape(batch * seq, -1).to(logits.device)
            # Same ops as the native router after its top-k: the bias only ever chose experts.
            weights = router.score_fn(logits).gather(1, flat)
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
            return logits, weights * router.routed_scaling_factor, flat

        return replay
