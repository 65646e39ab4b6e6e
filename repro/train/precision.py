"""The trainers' compute precision: the recipe's ``actor.dtype`` names and the cast every backend applies to its
model before training. Shared by both trainers, so neither imports the other's module for it."""

from __future__ import annotations

from typing import Callable

import torch

# actor.dtype -> the trainer's compute dtype (AdamW keeps fp32 masters either way)
COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def cast_for_training(model: torch.nn.Module, dtype: str,
                      keep_fp32: Callable[[str], bool] = lambda name: False) -> torch.nn.Module:
    """The model's parameters in the trainer's compute dtype, in eval mode (V4 has no dropout to switch on, and
    generate() expects eval). Rotary inv_freq buffers stay fp32, as Hugging Face's own bf16 loading keeps them, and
    so do the parameters ``keep_fp32(name)`` names: the tensors the release stores in FP32 (hyper-connections,
    sinks, compressor position bias), which LumenRL keeps FP32 too -- BF16 would round them in every update and
    every sync."""
    for name, param in model.named_parameters():
        if not keep_fp32(name):
            param.data = param.data.to(COMPUTE_DTYPES[dtype])
    return model.eval()
