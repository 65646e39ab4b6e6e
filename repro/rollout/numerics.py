"""Rollout numerics like vLLM's FP8 serving path, applied to the embedded engine's model as hooks.

AMD's rollout is vLLM serving DeepSeek-V4-Flash with ``quantization: fp8_per_block`` and ``kv_cache_dtype:
fp8_e4m3``. Besides the block-FP8 weights (``repro.rollout.fp8_view``) that path differs from an fp32 forward in
three ways, each emulated here by a pure tensor function and switched by its own recipe field:

1. W8A8 (``rollout.activation_quant``): before every linear whose weight is block-FP8, the activation is
   quantised per token in groups of 128 channels with a dynamic scale ``s = max(amax, 1e-10) / fp8_max`` and the
   GEMM multiplies the two FP8 operands (vLLM ``per_token_group_quant_fp8`` in
   ``model_executor/layers/quantization/utils/fp8_utils.py``; DeepSeek-V3 tech report §3.3.2, "1x128 tiles" for
   activations). fp8_max is 448 for e4m3fn and 224 for e4m3fnuz (vLLM's ``get_fp8_min_max`` on ROCm, not 240).
   Routed experts get the same treatment on their gate/up input and their down-projection input, as vLLM's fused
   block-FP8 MoE quantises both.
2. BF16 activations (``rollout.activation_dtype: bf16``): vLLM runs the model in BF16, so every GEMM writes BF16
   and the hidden streams between decoder layers are BF16. Emulated by rounding each linear's (and the experts')
   output and each decoder layer's output to BF16 (and back to fp32, where the rest of the CPU forward computes).
3. FP8 KV cache (``rollout.kv_cache_dtype: fp8_e4m3``): for DeepSeek-V4, vLLM stores its K=V cache in the
   ``fp8_ds_mla`` layout, not with a per-tensor k_scale/v_scale of 1.0: per token, the NoPE channels (448 of 512
   in V4-Flash) are rounded to BF16, then quantised to e4m3 in blocks of 64 channels each with a power-of-two
   (UE8M0) scale ``2**ceil(log2(max(amax, 1e-4) / 448))``, and the 64 RoPE channels stay BF16 (vLLM
   ``v1/attention/backends/mla/flashmla_sparse.py`` layout note; the write kernel in
   ``models/deepseek_v4/common/ops/fused_compress_quant_cache.py``). The compressed entries go through the same
   layout; the indexer's compressed keys are FP8 whole (one UE8M0 scale per token). Every cache read sees the
   round-tripped value, including the current token's own entry (vLLM attends from the cache). Any other model
   (the Qwen3-MoE of the Megatron lane) gets vLLM's generic fp8_e4m3 cache: one per-tensor scale, 1.0 unless
   calibrated (``set_default_quant_scales`` in ``model_executor/layers/attention/attention.py``), i.e. the plain
   e4m3 cast of K and V.

The engine's generation loop is unchanged: ``RolloutNumerics.install`` adds the hooks to the engine's own copy of
the model once, and ``wrap_cache`` wraps each new ``DynamicCache``.

Each function below runs as one compiled call on contiguous fp32 CPU tensors (``repro.fp8.forward_ops``, same
bits; the ~10-15 torch ops each costs otherwise were ~860 ops per decode forward) and as the torch ops written
here otherwise, which remain the reference the tests compare the kernel with.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from repro.fp8 import forward_ops
from repro.fp8.quant import get_format
from repro.fp8.rules import decide

# vLLM's dynamic activation quantisation range: torch's finfo for e4m3fn, 224 for fnuz (quant_utils.get_fp8_min_max).
ACTIVATION_FP8_MAX = {"e4m3fn": 448.0, "e4m3fnuz": 224.0}
ACTIVATION_EPS = 1e-10  # per_token_group_quant_fp8's default eps
KV_BLOCK = 64  # fp8_ds_mla: one UE8M0 scale per 64 NoPE channels
KV_AMAX_FLOOR = 1e-4  # the DSV4 cache-write kernel's floor on a block's amax
KV_FP8_MAX = 448.0  # the cache is e4m3fn (float8e4nv) on every platform


def _groups(x: torch.Tensor, group: int, what: str) -> tuple[torch.Tensor, int]:
    """x [..., K] as float32 [..., K/g, g] with g = min(group, K); K must be a multiple of g."""
    width = x.shape[-1]
    g = min(group, width)
    if width % g:
        raise ValueError(f"{what}: last dimension {width} is not a multiple of the group size {g}")
    return x.float().reshape(*x.shape[:-1], width // g, g), g


def quantize_per_token_group(
    x: torch.Tensor, group: int = 128, fmt: str = "e4m3fn", eps: float = ACTIVATION_EPS
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token-group FP8 quantisation (vLLM ``per_token_group_quant_fp8``, use_ue8m0=False).

    Args: x [..., K] (any float dtype); group: channels per scale (a row narrower than ``group`` is one group).
    Returns (q [..., K] in the FP8 dtype, scale [..., K/g] float32) with x ≈ q * scale, where
    scale = max(amax over the group, eps) / fp8_max and q = clamp(x / scale, ±fp8_max) rounded to nearest.
    """
    fp8 = get_format(fmt)
    grouped, _ = _groups(x, group, "quantize_per_token_group")
    scale = grouped.abs().amax(dim=-1, keepdim=True).clamp_min(eps) / ACTIVATION_FP8_MAX[fp8.name]
    limit = ACTIVATION_FP8_MAX[fp8.name]
    q = (grouped / scale).clamp(-limit, limit).to(fp8.dtype)
    return q.reshape(x.shape), scale.squeeze(-1)


def dequantize_per_token_group(q: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """Inverse of ``quantize_per_token_group``: q [..., K] FP8, scale [..., G] -> [..., K] in ``dtype``."""
    groups = scale.shape[-1]
    values = q.float().reshape(*q.shape[:-1], groups, q.shape[-1] // groups) * scale.unsqueeze(-1)
    return values.reshape(q.shape).to(dtype)


def fake_quant_activation(x: torch.Tensor, group: int = 128, fmt: str = "e4m3fn") -> torch.Tensor:
    """x [..., K] -> the value an FP8 GEMM sees for it, dequantised back to x's dtype (same shape)."""
    name = get_format(fmt).name
    fused = forward_ops.fake_quant(x, min(group, x.shape[-1]), ACTIVATION_FP8_MAX[name], eps=ACTIVATION_EPS,
                                   fnuz=name == "e4m3fnuz")
    if fused is not None:
        return fused
    q, scale = quantize_per_token_group(x, group, fmt)
    return dequantize_per_token_group(q, scale, x.dtype)


def round_to_bf16(x: torch.Tensor) -> torch.Tensor:
    """x rounded to BF16 (nearest even) and returned in its own dtype: what a BF16 tensor holds of it."""
    fused = forward_ops.bf16_round(x)
    if fused is not None:
        return fused
    return x.to(torch.bfloat16).to(x.dtype)


def ue8m0_fp8_round_trip(x: torch.Tensor, block: int = KV_BLOCK) -> torch.Tensor:
    """x [..., K] through e4m3fn with one power-of-two scale per ``block`` channels (fp8_ds_mla), back to x.dtype.

    Per block: the BF16-rounded values, scale = 2**ceil(log2(max(amax, 1e-4) / 448)), q = e4m3fn(x / scale); the
    result is q * scale. A row narrower than ``block`` is one block.
    """
    fused = forward_ops.kv_round_trip(x, 0, min(block, x.shape[-1]), KV_AMAX_FLOOR, KV_FP8_MAX)
    if fused is not None:
        return fused
    grouped, _ = _groups(round_to_bf16(x.float()), block, "ue8m0_fp8_round_trip")
    exponent = torch.ceil(torch.log2(grouped.abs().amax(dim=-1, keepdim=True).clamp_min(KV_AMAX_FLOOR) / KV_FP8_MAX))
    inverse, scale = torch.exp2(-exponent), torch.exp2(exponent)
    q = (grouped * inverse).clamp(-KV_FP8_MAX, KV_FP8_MAX).to(torch.float8_e4m3fn)
    return (q.float() * scale).reshape(x.shape).to(x.dtype)


def per_tensor_fp8_round_trip(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """x through e4m3fn with one fixed scale (vLLM's generic FP8 KV cache, k_scale = v_scale = 1.0): same shape and
    dtype, values clamp(x / scale, ±448) rounded to e4m3, times scale."""
    q = (x.float() / scale).clamp(-KV_FP8_MAX, KV_FP8_MAX).to(torch.float8_e4m3fn)
    return (q.float() * scale).to(x.dtype)


def kv_cache_round_trip(kv: torch.Tensor, rope_dim: int, block: int = KV_BLOCK) -> torch.Tensor:
    """One DeepSeek-V4 K=V cache entry [..., D] as the fp8_ds_mla layout stores it, read back in kv's dtype.

    The leading D - rope_dim (NoPE) channels go through ``ue8m0_fp8_round_trip`` (blocks of 64), the trailing
    ``rope_dim`` (RoPE) channels are kept in BF16. Shape and dtype are kept.
    """
    nope_width = kv.shape[-1] - rope_dim
    if nope_width > 0:
        fused = forward_ops.kv_round_trip(kv, rope_dim, min(block, nope_width), KV_AMAX_FLOOR, KV_FP8_MAX)
        if fused is not None:
            return fused
    nope, rope = kv[..., : kv.shape[-1] - rope_dim], kv[..., kv.shape[-1] - rope_dim :]
    return torch.cat([ue8m0_fp8_round_trip(nope, block), round_to_bf16(rope)], dim=-1)


@dataclass
class RolloutNumerics:
    """Which of vLLM's numerics the embedded engine applies (all off: the plain fp32 forward)."""

    activation_quant: bool = False
    activation_group: int = 128
    bf16_activations: bool = False
    kv_cache_fp8: bool = False
    fp8_format: str = "e4m3fn"
    hooked: list[str] = field(default_factory=list)  # module names given a hook, for reports and tests

    @classmethod
    def from_rollout(cls, rollout) -> "RolloutNumerics":
        """The numerics a recipe's ``rollout`` section asks for (``fp8_format: auto`` is e4m3fn on CPU)."""
        return cls(
            # W8A8 needs FP8 weights: with weight_format bf16 the linears are BF16 GEMMs
            activation_quant=rollout.activation_quant == "fp8_per_token_group" and rollout.weight_format == "fp8_block",
            activation_group=rollout.activation_group,
            bf16_activations=rollout.activation_dtype == "bf16",
            kv_cache_fp8=rollout.kv_cache_dtype == "fp8_e4m3",
            fp8_format="e4m3fn" if rollout.fp8_format == "auto" else rollout.fp8_format,
        )

    @property
    def active(self) -> bool:
        return self.activation_quant or self.bf16_activations or self.kv_cache_fp8

    # -- hooks on the model ------------------------------------------------------------------------------
    def install(self, model: torch.nn.Module) -> torch.nn.Module:
        """Hook ``model`` in place (the engine's own copy): input quantisation and output rounding per module."""
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear):
                self._hook(name, module, quantised=decide(f"{name}.weight", tuple(module.weight.shape),
                                                          module.weight.dtype).quantise)
            elif hasattr(module, "gate_up_proj") and hasattr(module, "_apply_gate"):  # stacked routed experts
                weight = module.gate_up_proj
                self._hook(name, module, quantised=decide(f"{name}.gate_up_proj", tuple(weight.shape),
                                                          weight.dtype).quantise)
                if self.activation_quant:
                    module._apply_gate = self._quantised_gate(module._apply_gate)
        if self.bf16_activations:
            inner = getattr(model, "model", model)
            for name, module in [("embed_tokens", getattr(inner, "embed_tokens", None))] + [
                (f"layers.{i}", layer) for i, layer in enumerate(getattr(inner, "layers", []))
            ]:
                if module is not None:
                    module.register_forward_hook(_round_output)
                    self.hooked.append(name)
        return model

    def _hook(self, name: str, module: torch.nn.Module, quantised: bool) -> None:
        if quantised and self.activation_quant:
            group, fmt = self.activation_group, self.fp8_format

            def quantise_input(_module, args):
                return (fake_quant_activation(args[0], group, fmt), *args[1:])

            module.register_forward_pre_hook(quantise_input)
        if self.bf16_activations:
            module.register_forward_hook(_round_output)
        if (quantised and self.activation_quant) or self.bf16_activations:
            self.hooked.append(name)

    def _quantised_gate(self, apply_gate):
        group, fmt = self.activation_group, self.fp8_format

        def gate_then_quantise(gate_up: torch.Tensor) -> torch.Tensor:
            return fake_quant_activation(apply_gate(gate_up), group, fmt)  # the down projection's FP8 input

        return gate_then_quantise

    # -- the KV cache ------------------------------------------------------------------------------------
    def wrap_cache(self, cache, config):
        """``cache`` (a ``DynamicCache``) with every write of a K=V entry stored as fp8_ds_mla would hold it."""
        if not self.kv_cache_fp8:
            return cache
        if getattr(config, "model_type", "") != "deepseek_v4":  # vLLM's generic per-tensor FP8 cache
            for layer in cache.layers:
                layer.update = _quantised_update(layer.update, per_tensor_fp8_round_trip)
            return cache
        rope_dim = config.qk_rope_head_dim
        for layer in cache.layers:
            layer.update = _quantised_update(layer.update, lambda kv: kv_cache_round_trip(kv, rope_dim))
            if hasattr(layer, "update_compressor_states"):
                layer.update_compressor_states = _quantised_compressed(layer.update_compressor_states, rope_dim)
        return cache


def _round_output(_module, _args, output):
    if isinstance(output, torch.Tensor):
        return round_to_bf16(output)
    return output


def _quantised_update(update, round_trip):
    def store(key_states, value_states, *args, **kwargs):
        shared = value_states is key_states  # DeepSeek-V4: K=V, one tensor
        key_states = round_trip(key_states)
        value_states = key_states if shared else round_trip(value_states)
        return update(key_states, value_states, *args, **kwargs)

    return store


def _quantised_compressed(update_compressor_states, rope_dim: int):
    def store(name: str, compressed: torch.Tensor):
        if compressed.numel():
            compressed = (ue8m0_fp8_round_trip(compressed, block=compressed.shape[-1]) if name == "indexer"
                          else kv_cache_round_trip(compressed, rope_dim))
        return update_compressor_states(name, compressed)

    return store

