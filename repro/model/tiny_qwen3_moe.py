"""A tiny random Qwen3-MoE checkpoint (BF16 safetensors + an offline word-level tokenizer), no Hub access.

It is the model of the vLLM CPU lane: vLLM's CPU backend cannot run even a tiny DeepSeek-V4 (head_dim 512 and
an FP8 KV cache, Triton CPU kernels, AMX), but it runs Qwen3-MoE -- a top-k routed MoE causal LM with the
same rollout contract -- in BF16. The embedded engine runs the same folder, so both can be compared.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

BOS_ID, EOS_ID, PAD_ID = 1, 2, 0
VOCAB_SIZE = 256


def _tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD_ID, "<s>": BOS_ID, "</s>": EOS_ID}
    for i in range(3, VOCAB_SIZE):
        vocab[f"t{i}"] = i
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<pad>")
    fast.save_pretrained(out)


def build_tiny_qwen3_moe(out_dir: str | Path, seed: int = 0, num_layers: int = 2) -> Path:
    """Write a random tiny Qwen3-MoE (8 experts, top-2, head_dim 64) to ``out_dir`` in BF16 and return it."""
    from transformers import GenerationConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = Qwen3MoeConfig(
        vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
        pad_token_id=PAD_ID, dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():  # a sharper-than-init output layer, so sampling is not uniform noise
        model.lm_head.weight.normal_(0, 0.3)
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    model.save_pretrained(out, safe_serialization=True)
    _tokenizer(out)
    return out


def build_tiny_math_qwen3_moe(out_dir: str | Path, seed: int = 0) -> Path:
    """A random tiny Qwen3-MoE (2 layers, 8 experts top-2, head_dim 64 as vLLM's CPU attention wants) in fp32 with
    the tiny-math character tokenizer, vocabulary padded to 32 so it splits over 2 or 4 tensor-parallel ranks:
    the model with which the Megatron lanes run the whole loop (trainer ranks in megatron layout, rollout and
    sync in HF layout)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from repro.model.hf_folder import save_checkpoint
    from repro.model.tokenizer import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    config = Qwen3MoeConfig(
        vocab_size=32, hidden_size=64, intermediate_size=128, moe_intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=256,
        tie_word_embeddings=False, rms_norm_eps=1e-6, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(config).float()
    return save_checkpoint(model, tokenizer, out_dir)


def checkpoint_tensors(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors files, under its checkpoint name."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


if __name__ == "__main__":  # pragma: no cover - a quick look at what gets written
    import sys

    folder = build_tiny_qwen3_moe(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tiny-qwen3-moe")
    print(json.dumps({k: list(v.shape) for k, v in checkpoint_tensors(folder).items()}, indent=0)[:2000])
