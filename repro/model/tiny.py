"""The tiny genuine DeepSeek-V4 (transformers ``DeepseekV4ForCausalLM``, ~2.2M parameters) used on a laptop CPU.

Every mechanism of the full model is present: mHC residual streams, a hash-MoE layer then top-k MoE layers
with a shared expert, and all three attention kinds (sliding, compressed-sparse with its Lightning Indexer,
heavily-compressed). Sizes follow shared/notes/tiny-learning.md, where this shape was measured to learn.

Compress rates vs the task's lengths: a tiny-math sequence is BOS + 6 prompt chars + ``Answer: NN`` + EOS,
i.e. 17-19 tokens. CSA keeps the real rate 4 (entries at positions 3, 7, 11, 15). The real HCA rate 128 would
never close a window, and the note's 16 closes exactly one window, visible only to the last 2-4 queries; we use
8 so HCA emits entries at positions 7 and 15 and both the prompt's last token and most of the response see a
compressed entry. ``index_topk`` 16 is above the <= 4 CSA entries, so the indexer keeps every causally valid
entry: no top-k tie can make cached decoding differ from a full forward (8 indexer heads also keep its
scores away from exact-zero ties).
"""

from __future__ import annotations

import torch
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

# the token ids are the tokenizer's (specials first, then TINY_ALPHABET); re-exported for the model's users
from repro.model.tokenizer import BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID, TINY_VOCAB_SIZE  # noqa: F401


# The documented tiny configuration. Keys are DeepseekV4Config fields.
TINY_CONFIG: dict = {
    "vocab_size": TINY_VOCAB_SIZE,
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,  # V4 is shared-KV MQA
    "head_dim": 64,
    "partial_rotary_factor": 0.25,  # rope on the trailing 16 of 64 channels (full model: 64 of 512)
    "q_lora_rank": 64,
    "o_groups": 2,
    "o_lora_rank": 64,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 128,
    "scoring_func": "sqrtsoftplus",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "layer_types": [
        "sliding_attention",
        "compressed_sparse_attention",
        "heavily_compressed_attention",
        "compressed_sparse_attention",
    ],
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"],
    "sliding_window": 64,  # longer than any tiny-math sequence: the sliding branch sees the whole context
    "index_n_heads": 8,
    "index_head_dim": 32,
    "index_topk": 16,
    "hc_mult": 2,
    "hc_sinkhorn_iters": 20,
    "max_position_embeddings": 256,
    "num_nextn_predict_layers": 0,
    "tie_word_embeddings": False,
    "bos_token_id": BOS_TOKEN_ID,
    "eos_token_id": EOS_TOKEN_ID,
    "pad_token_id": PAD_TOKEN_ID,
}


def tiny_config(**overrides) -> DeepseekV4Config:
    """The tiny DeepSeek-V4 config; ``overrides`` replace TINY_CONFIG fields. Attention is eager (V4 is eager-only)."""
    config = DeepseekV4Config(**{**TINY_CONFIG, **overrides})
    config._attn_implementation = "eager"
    return config


def fill_hash_routing(model: DeepseekV4ForCausalLM, seed: int) -> None:
    """Give every token of every hash-MoE layer ``top_k`` distinct experts, drawn with ``seed``.

    transformers initialises ``tid2eid`` to zeros (real values come from a checkpoint), which would send every
    token to expert 0 twice; a trained V4 ships a fixed table, which is what this seeded one stands in for.
    """
    generator = torch.Generator().manual_seed(seed + 7919)  # offset: independent of the weight init stream
    for layer in model.model.layers:
        gate = layer.mlp.gate
        if not hasattr(gate, "tid2eid"):
            continue
        vocab, top_k = gate.tid2eid.shape
        table = torch.stack([torch.randperm(gate.num_experts, generator=generator)[:top_k] for _ in range(vocab)])
        gate.tid2eid.copy_(table.to(gate.tid2eid.dtype))


def build_tiny_model(seed: int = 0, **overrides) -> DeepseekV4ForCausalLM:
    """A freshly initialised tiny DeepSeek-V4 in float32, deterministic in ``seed``, in eval mode."""
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(tiny_config(**overrides))
    with torch.no_grad():
        fill_hash_routing(model, seed)
    return model.float().eval()


def parameter_count(model: torch.nn.Module) -> int:
    """Number of trainable parameters (buffers such as ``tid2eid`` are not counted)."""
    return sum(p.numel() for p in model.parameters())
