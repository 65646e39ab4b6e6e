"""config.json in the release's keys (deepseek-ai/DeepSeek-V4-Flash), made from a transformers ``DeepseekV4Config``.

The release writes per-layer attention as ``compress_ratios`` (one ratio per layer, then one per MTP layer: 0
sliding, 4 compressed-sparse, 128 heavily-compressed), the hash-routed prefix as ``num_hash_layers``, the rope
width as ``qk_rope_head_dim``, and the router as ``topk_method: noaux_tc`` (vLLM builds the router's selection
bias, ``ffn.gate.bias``, only under that value). transformers 5.24 reads those keys as legacy spellings.

One tiny departure: its heavily-compressed rate is 8, not 128 (a 128-token window never closes on 17-token
tiny-math sequences, see repro/model/tiny.py), and transformers maps a ratio to a layer kind through a fixed
{0, 4, 128} table. So a tiny config also carries transformers' own ``layer_types`` / ``compress_rates``, which
transformers prefers over ``compress_ratios``; vLLM reads ``compress_ratios``.
"""

from __future__ import annotations

from transformers import DeepseekV4Config

# DeepseekV4Config field -> config.json key of the release, for fields the release spells differently.
_RATIO_OF_KIND = {"sliding_attention": 0}
_STANDARD_RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
# Keys copied as they are (the release and transformers agree on these names).
_SAME_KEYS = (
    "vocab_size", "hidden_size", "moe_intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "q_lora_rank", "o_lora_rank", "o_groups", "hidden_act", "swiglu_limit",
    "rms_norm_eps", "max_position_embeddings", "sliding_window", "rope_theta", "compress_rope_theta",
    "index_n_heads", "index_head_dim", "index_topk", "hc_mult", "hc_sinkhorn_iters", "hc_eps", "n_routed_experts",
    "n_shared_experts", "num_experts_per_tok", "norm_topk_prob", "routed_scaling_factor", "scoring_func",
    "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "attention_bias", "attention_dropout",
    "initializer_range", "use_cache",
)


def compress_ratios(config: DeepseekV4Config, mtp_layers: int) -> list[int]:
    """One ratio per layer, then 0 (sliding) per MTP layer, as the release's MTP layer is."""
    rates = {**_RATIO_OF_KIND, **config.compress_rates}
    return [int(rates[kind]) for kind in config.layer_types] + [0] * mtp_layers


def hash_layer_count(config: DeepseekV4Config) -> int:
    """``num_hash_layers``: the release's hash-routed layers are a prefix; refuse any other pattern."""
    kinds = list(config.mlp_layer_types)
    count = kinds.index("moe") if "moe" in kinds else len(kinds)
    if any(k != "moe" for k in kinds[count:]):
        raise ValueError(f"mlp_layer_types {kinds}: the release can only express hash_moe layers as a prefix")
    return count


def release_config(config: DeepseekV4Config, mtp_layers: int = 0, torch_dtype: str = "bfloat16") -> dict:
    """The release-keyed config.json for ``config`` with ``mtp_layers`` MTP layers."""
    out = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4"}
    out.update({key: getattr(config, key) for key in _SAME_KEYS})
    out.update(
        num_nextn_predict_layers=mtp_layers,
        num_hash_layers=hash_layer_count(config),
        qk_rope_head_dim=config.qk_rope_head_dim,
        compress_ratios=compress_ratios(config, mtp_layers),
        topk_method="noaux_tc",
        torch_dtype=torch_dtype,
    )
    if any(config.compress_rates.get(k) != v for k, v in _STANDARD_RATES.items()):
        out.update(layer_types=list(config.layer_types), compress_rates=dict(config.compress_rates))
    return dict(sorted(out.items()))
