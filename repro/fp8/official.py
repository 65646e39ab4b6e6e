"""The official DeepSeek-V4 release's storage format (deepseek-ai/DeepSeek-V4-Flash), for tiny test checkpoints.

    tensors = official_tensors(release_named_bf16_tensors)
    config = {**release_config, **OFFICIAL_CONFIG_KEYS}

Linear weights the converter would quantise (``repro.fp8.rules.decide``) are e4m3fn with a power-of-two block
scale stored as E8M0 (``<x>.scale`` [ceil(N/128), ceil(K/128)]); routed experts are MXFP4, packed two values a
byte (``experts.E.wN.weight`` [N, K/2], int8 as the release's headers have it, or safetensors' ``F4``) with one
E8M0 scale per 32 values (``experts.E.wN.scale`` [N, K/32]); everything else stays as it was (BF16, the FP32 list,
int64 ``tid2eid``). The dtypes and shapes follow a third-party loader that pins them to the release's headers
(docs/checkpoint-layouts.md); we have not read the 160 GB release itself.
"""

from __future__ import annotations

import re

import torch

from repro.fp8.mxfp4 import float_to_e8m0, quantize_mxfp4
from repro.fp8.quant import quantize_block
from repro.fp8.rules import decide, release_scale_name

OFFICIAL_CONFIG_KEYS = {
    "expert_dtype": "fp4",
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
}
_ROUTED_EXPERT = re.compile(r"(^|\.)ffn\.experts\.\d+\.w[123]\.weight$")
FP4_STORAGE = {"int8": torch.int8, "F4": torch.float4_e2m1fn_x2}


def official_tensors(tensors: dict[str, torch.Tensor], fp4_storage: str = "int8") -> dict[str, torch.Tensor]:
    """Release-named high-precision tensors -> the official release's FP8 / MXFP4 / E8M0 storage."""
    if fp4_storage not in FP4_STORAGE:
        raise ValueError(f"fp4_storage must be one of {sorted(FP4_STORAGE)}, got {fp4_storage!r}")
    out = {}
    for name, tensor in tensors.items():
        if _ROUTED_EXPERT.search(name):
            packed, scale = quantize_mxfp4(tensor)
            out[name] = packed.view(FP4_STORAGE[fp4_storage])
            out[release_scale_name(name)] = scale
        elif decide(name, tuple(tensor.shape), tensor.dtype).quantise:
            q, scale = quantize_block(tensor, "e4m3fn", pow2_scale=True)
            out[name] = q
            out[release_scale_name(name)] = float_to_e8m0(scale)
        else:
            out[name] = tensor
    return out
