"""What the embedded engine computes with when the recipe serves FP8: each quantisable weight round-tripped
through block-wise FP8 (quantise, then dequantise to fp32), the rest untouched.

This is the rollout side of AMD's weight sync: BF16 arrives, FP8 is made on the rollout, and the engine's
distribution differs from the trainer's exactly by that quantisation. Which tensors are quantised is
``repro.fp8.rules.decide`` -- the same rule the checkpoint converter uses.
"""

from __future__ import annotations

import torch

from repro.fp8.quant import dequantize_block, quantize_block
from repro.fp8.rules import decide


class FP8WeightView:
    """Callable ``dict[name, tensor] -> dict[name, tensor]``; records which names it quantised."""

    def __init__(self, fmt: str = "e4m3fn", block: int = 128, pow2_scale: bool = False):
        self.fmt, self.block, self.pow2_scale = fmt, block, pow2_scale
        self.quantised: list[str] = []

    def __call__(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        served, quantised = {}, []
        for name, tensor in weights.items():
            if decide(name, tuple(tensor.shape), tensor.dtype).quantise:
                q, scale = quantize_block(tensor, self.fmt, block_size=self.block, pow2_scale=self.pow2_scale)
                served[name] = dequantize_block(q, scale, block_size=self.block, dtype=torch.float32)
                quantised.append(name)
            else:
                served[name] = tensor.float() if tensor.is_floating_point() else tensor
        self.quantised = quantised
        return served


def weight_view_for(weight_format: str, fp8_format: str, block: list[int], scale: str):
    """The view a recipe's rollout section asks for (``fp8_format: auto`` resolves to e4m3fn on CPU)."""
    if weight_format == "bf16":
        return lambda weights: {n: t.float() if t.is_floating_point() else t for n, t in weights.items()}
    if block[0] != block[1]:
        raise ValueError(f"rollout.fp8_block: only square blocks are supported, got {block}")
    fmt = "e4m3fn" if fp8_format == "auto" else fp8_format
    return FP8WeightView(fmt, block[0], pow2_scale=scale == "ue8m0")
