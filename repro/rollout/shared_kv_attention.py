"""Eager attention with sinks that reads a shared K/V head once instead of copying it to every query head.

transformers' ``eager_attention_forward`` (the only backend DeepSeek-V4 supports: SDPA has no sink term) first
``repeat_kv``s the key and the value to all query heads -- two copies of the whole cache per layer and step -- then
multiplies ``batch x heads`` tiny matrices. DeepSeek-V4 has one K=V head (shared-KV MQA, paper §2.3), so the
embedded engine's decode step spends most of its attention time in those copies. Here the query heads of a KV
group are stacked along the query axis instead: ``[B, G, (H/G)*S, D] @ [B, G, D, T]`` is the same set of dot
products with no copy of K or V. The rest is eager's math, op for op: scale, additive mask, a per-head sink
logit appended to each row, softmax, the sink column dropped, times V (``eager_attention_forward`` in
``transformers/models/deepseek_v4/modeling_deepseek_v4.py``, gpt-oss-style sinks). Eager's subtraction of the
row max before the softmax is left out: ``softmax`` subtracts it itself, so the result is the same.

Registered with transformers' ``AttentionInterface`` (and eager's additive mask with ``AttentionMaskInterface``)
under ``SHARED_KV_ATTENTION``; ``use_shared_kv_attention`` switches one model instance to it. Sums may round
differently from eager's (different GEMM shapes), at the level of float32 rounding -- the tests bound it.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

SHARED_KV_ATTENTION = "repro_shared_kv_eager"


def shared_kv_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Eager attention with sinks without ``repeat_kv``.

    Args: query [B, H, S, D]; key, value [B, G, T, D] with H a multiple of G; attention_mask additive
    [B or 1, 1, S, T] or None; ``module.sinks`` [H]. Returns (output [B, S, H, D] contiguous, weights [B, H, S, T]).
    """
    if dropout and module.training:
        raise ValueError(f"{SHARED_KV_ATTENTION} is for inference: attention dropout {dropout} in training mode")
    batch, heads, queries, dim = query.shape
    groups, keys = key.shape[1], key.shape[2]
    if heads % groups:
        raise ValueError(f"{SHARED_KV_ATTENTION}: {heads} query heads do not split into {groups} KV heads")
    stacked = query.reshape(batch, groups, heads // groups * queries, dim)
    logits = torch.matmul(stacked, key.transpose(2, 3)).view(batch, heads, queries, keys) * scaling
    if attention_mask is not None:
        logits = logits + attention_mask
    sinks = module.sinks.reshape(1, -1, 1, 1).expand(batch, -1, queries, -1)
    weights = torch.softmax(torch.cat([logits, sinks], dim=-1), dim=-1)[..., :-1].to(value.dtype)
    output = torch.matmul(weights.reshape(batch, groups, heads // groups * queries, keys), value)
    return output.view(batch, heads, queries, dim).transpose(1, 2).contiguous(), weights


AttentionInterface.register(SHARED_KV_ATTENTION, shared_kv_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(SHARED_KV_ATTENTION, eager_mask)


def use_shared_kv_attention(model: torch.nn.Module) -> bool:
    """Switch ``model`` (in place) from eager attention with sinks to ``shared_kv_attention``; True if it did.
    Only a float32 DeepSeek-V4 is switched: other models keep whatever backend they have."""
    config = model.config
    if getattr(config, "model_type", "") != "deepseek_v4" or config._attn_implementation != "eager":
        return False
    # Only in float32: eager subtracts the row max in the model's dtype before its softmax, and in BF16 that
    # subtraction rounds (a BF16 tiny model's logits then differ by up to 5.3 on a 256-row batch, routing flips)
    if any(p.dtype != torch.float32 for p in model.parameters() if p.is_floating_point()):
        return False
    model.set_attn_implementation(SHARED_KV_ATTENTION)
    return True
