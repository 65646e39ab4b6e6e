"""Which tensors become block-wise FP8, and why the others stay in high precision.

One function decides, `decide(name, shape, dtype)`, and it returns the reason with the answer so that the
whole plan of a checkpoint can be listed (`decision_table`, shown in notebook 01). The rule:

1. Named exceptions stay high precision (checked first, so the listed reason is the specific one):
   embeddings, the LM head, norms, the MoE router (gate weight, its bias, DSV4's hash table `tid2eid`),
   DSV4's KV compressors and the indexer's scorer `weights_proj` (DeepSeek-V4-Flash ships these in BF16
   with no scale), the mHC hyper-connection parameters (`hc_*`, `*_hc.*`), attention sinks and the
   compressors' absolute position embedding (`ape`).
2. Anything that is not a floating-point matrix stays: integer tables, 1-D norms/biases/scales.
3. What is left and is a 2-D `*.weight` is a linear layer's weight: it becomes FP8 with a 128×128 block scale.
   One addition: the 3-D stacked routed-expert tensors of transformers' in-memory layout
   (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]) are E linear weights, each quantised
   on its own 128×128 grid, as transformers' and vLLM's fused FP8 MoE layers hold them. On disk the experts
   are separate 2-D tensors (`experts.{e}.w1.weight`), so this only matters for in-memory weight sync.

The names covered are both spellings of DeepSeek-V4 (the checkpoint's, `layers.0.attn.wq_a.weight`, and
transformers' module names, `layers.0.self_attn.q_a_proj.weight`) and DeepSeek-V3's; tests/test_fp8_rules.py
checks every tensor of a tiny `DeepseekV4ForCausalLM` and `DeepseekV3ForCausalLM` in both spellings.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Decision:
    quantise: bool
    reason: str


# (pattern searched in the tensor name, why it stays high precision). First match wins.
KEEP_HIGH_PRECISION: tuple[tuple[str, str], ...] = (
    (r"(^|\.)(embed_tokens|embed)\.weight$", "embedding table (a lookup, not a matmul)"),
    (r"(^|\.)(lm_head|head)\.weight$", "LM head: logits are sensitive, DeepSeek ships it BF16"),
    (r"norm\.weight$", "norm scale"),
    (r"(^|\.)(mlp|ffn)\.gate\.weight$", "MoE router gate: expert choice is sensitive, DeepSeek ships it BF16"),
    (r"(^|\.)gate\.(bias|e_score_correction_bias)$", "MoE router bias"),
    (r"(^|\.)tid2eid$", "hash-MoE token-to-expert table (integer)"),
    (
        r"\.compressor\.(indexer\.)?(wkv|wgate|kv_proj|gate_proj)\.weight$",
        "DSV4 KV compressor projection (BF16 in DeepSeek-V4-Flash)",
    ),
    (r"\.weights_proj\.weight$", "DSV4 indexer scorer weights (BF16 in DeepSeek-V4-Flash)"),
    (r"(^|\.)(hc_\w+|\w+_hc)(\.|$)", "mHC hyper-connection parameter (fp32 in the model)"),
    (r"(^|\.)(attn_sink|sinks)$", "attention sink logits"),
    (r"(^|\.)(ape|position_bias)$", "DSV4 compressor absolute position embedding"),
)
_KEEP = tuple((re.compile(pattern), reason) for pattern, reason in KEEP_HIGH_PRECISION)
_STACKED_EXPERTS = re.compile(r"(^|\.)experts\.(gate_up_proj|up_proj|down_proj)$")

QUANTISED_LINEAR = "2-D linear weight"
QUANTISED_EXPERTS = "stacked routed-expert weights, one 128x128 grid per expert"


def decide(name: str, shape: Sequence[int], dtype: torch.dtype) -> Decision:
    """Whether tensor `name` of `shape` and `dtype` is stored as block FP8, and why (see the module doc)."""
    for pattern, reason in _KEEP:
        if pattern.search(name):
            return Decision(False, reason)
    if not dtype.is_floating_point:
        return Decision(False, f"not floating point ({str(dtype).removeprefix('torch.')})")
    if len(shape) == 3 and _STACKED_EXPERTS.search(name):
        return Decision(True, QUANTISED_EXPERTS)
    if len(shape) != 2:
        return Decision(False, f"{len(shape)}-D, not a matrix")
    if not name.endswith(".weight"):
        return Decision(False, "2-D but not a linear layer's .weight")
    return Decision(True, QUANTISED_LINEAR)


def scale_name(name: str) -> str:
    """Name of the block-scale tensor stored next to quantised `name` (DeepSeek-V3 convention).

    `x.weight` -> `x.weight_scale_inv`; a stacked expert tensor `experts.gate_up_proj` ->
    `experts.gate_up_proj_scale_inv` (transformers' FP8 experts spelling).
    """
    return name + "_scale_inv"


def release_scale_name(name: str) -> str:
    """The DeepSeek-V4 release's spelling: `x.weight` -> `x.scale` (vLLM maps it to `x.weight_scale_inv`)."""
    if not name.endswith(".weight"):
        raise ValueError(f"{name}: the release names scales after a `.weight`")
    return name.removesuffix("weight") + "scale"


# How a block scale is named after its weight `x.weight`, by checkpoint family. A tensor is a scale only if its
# weight is present and FP8 (or packed FP4): names alone would take transformers' `attn_hc.scale` (an mHC
# parameter) for one.
SCALE_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("weight_scale_inv", "DeepSeek-V3 / transformers: x.weight_scale_inv"),
    ("scale", "DeepSeek-V4 release: x.scale"),
    ("weight_scale", "compressed-tensors / Quark: x.weight_scale"),
    ("input_scale", "static activation scale: x.input_scale"),
)


def scale_owner(name: str) -> str | None:
    """The weight a tensor named `name` would be the scale of, under the first convention its name fits."""
    for suffix, _ in SCALE_SUFFIXES:
        if name.endswith("." + suffix):
            return name.removesuffix(suffix) + "weight"
        if suffix == "weight_scale_inv" and name.endswith("_scale_inv"):
            return name.removesuffix("_scale_inv")  # stacked experts: gate_up_proj_scale_inv
    return None


def pair_scales(dtypes: dict[str, torch.dtype]) -> dict[str, str]:
    """scale name -> weight name for every tensor of a checkpoint (name -> dtype) that scales a quantised weight."""
    quantised = {n for n, d in dtypes.items() if d in LOW_PRECISION}
    return {n: w for n in dtypes if (w := scale_owner(n)) is not None and w in quantised}


# Stored low-precision weights: FP8, and MXFP4 as packed bytes (F4, or I8/U8 as the official release's headers)
LOW_PRECISION = (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz,
                 torch.float4_e2m1fn_x2, torch.int8, torch.uint8)


def scale_shape(shape: Sequence[int], block_size: int = 128) -> tuple[int, ...]:
    """[..., N, K] -> [..., ceil(N/block), ceil(K/block)]."""
    *lead, n, k = shape
    return (*lead, -(-n // block_size), -(-k // block_size))


def decision_table(tensors: Iterable[tuple[str, Sequence[int], torch.dtype]]):
    """One row per tensor: name, shape, dtype, action ("fp8" or "keep") and the reason, as a DataFrame."""
    import pandas as pd

    rows = []
    for name, shape, dtype in tensors:
        d = decide(name, shape, dtype)
        rows.append(
            {
                "name": name,
                "shape": tuple(shape),
                "dtype": str(dtype).removeprefix("torch."),
                "action": "fp8" if d.quantise else "keep",
                "reason": d.reason,
            }
        )
    return pd.DataFrame(rows, columns=["name", "shape", "dtype", "action", "reason"])
