"""A tiny genuine DeepSeek-V4 BF16 checkpoint (transformers' `DeepseekV4ForCausalLM`, ~2.4M parameters),
for notebook 01 and the tests when no input checkpoint is given.

Sizes follow shared/notes/tiny-learning.md (hidden 128, 4 layers covering sliding / compressed-sparse /
heavily-compressed attention, 8 routed experts + 1 shared, hash-MoE first layer, mHC with 2 streams). Several
projections are 64 wide, so the FP8 edge-block path (shapes that are not multiples of 128) is exercised.
This is for FP8 conversion only; the model used for training is built by `repro.model`.
"""

from __future__ import annotations

from pathlib import Path


def tiny_dsv4_config(vocab_size: int = 32):
    from transformers import DeepseekV4Config

    return DeepseekV4Config(
        vocab_size=vocab_size, hidden_size=128, num_hidden_layers=4,
        layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                     "compressed_sparse_attention"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
        num_attention_heads=4, head_dim=64, q_lora_rank=64, o_groups=2, o_lora_rank=64,
        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=128,
        mlp_layer_types=["hash_moe", "moe", "moe", "moe"], index_n_heads=8, index_topk=16, sliding_window=64,
        hc_mult=2, max_position_embeddings=256, bos_token_id=0, eos_token_id=1,
    )


def build_tiny_model(seed: int = 0, vocab_size: int = 32):
    """A seeded random-init tiny DeepseekV4ForCausalLM in bf16 (fp32-kept modules stay fp32 in memory)."""
    import torch
    from transformers import DeepseekV4ForCausalLM

    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(tiny_dsv4_config(vocab_size))
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("tid2eid"):  # hash-MoE table: distinct experts per token, seeded
                g = torch.Generator().manual_seed(seed)
                n_exp = model.config.n_routed_experts
                buf.copy_(torch.stack([torch.randperm(n_exp, generator=g)[: buf.shape[1]] for _ in range(buf.shape[0])]))
    return model.to(torch.bfloat16).eval()


def build_tiny_checkpoint(out_dir: str | Path, seed: int = 0, max_shard_size: str | int = "1MB") -> Path:
    """Save the tiny model as an HF-layout BF16 checkpoint (several shards + index by default)."""
    out_dir = Path(out_dir)
    build_tiny_model(seed).save_pretrained(out_dir, max_shard_size=max_shard_size)
    return out_dir
