"""A tiny megatron-core GPT with MoE layers: the model the CPU lanes train (megatron-core has no DeepSeek-V4
layers; on a cluster ``actor.model_provider`` names the DSV4 provider, docs/megatron-dsv4.md).

``provider(recipe)`` is the ``actor.model_provider`` of the CPU recipes: it builds this rank's part of the
model for the live parallel layout and fills it from one seeded full (world-size-1) initialisation, so the same
seed gives the same model whatever TP/PP/EP/DP it is split over -- what the multi-rank tests compare against.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import torch

from repro.train.megatron.parallel import ensure_model_parallel, load_full_weights


@dataclass(frozen=True)
class TinyGPTMoE:
    """Sizes of the tiny GPT/MoE the CPU tests train (vocab of the tiny tokenizer, 8 experts top-2 like tiny DSV4)."""

    vocab_size: int = 25
    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    ffn_hidden_size: int = 128
    num_moe_experts: int = 8
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int = 64
    moe_shared_expert_intermediate_size: int = 64
    max_sequence_length: int = 256


def tiny_transformer_config(spec: TinyGPTMoE = TinyGPTMoE(), **overrides):
    """``TransformerConfig`` of the tiny model: sigmoid router scores renormalised over the top-k and scaled 1.5
    (DSV4's shape of routing), no biases, SwiGLU experts, RMSNorm, routing replay on, no fused CUDA kernels."""
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    settings = dict(
        num_layers=spec.num_layers, hidden_size=spec.hidden_size, num_attention_heads=spec.num_attention_heads,
        ffn_hidden_size=spec.ffn_hidden_size, num_moe_experts=spec.num_moe_experts,
        moe_router_topk=spec.moe_router_topk, moe_ffn_hidden_size=spec.moe_ffn_hidden_size,
        moe_shared_expert_intermediate_size=spec.moe_shared_expert_intermediate_size,
        moe_token_dispatcher_type="allgather", moe_router_score_function="sigmoid",
        moe_router_topk_scaling_factor=1.5, moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
        moe_enable_routing_replay=True, add_bias_linear=False, gated_linear_unit=True, activation_func=F.silu,
        normalization="RMSNorm", hidden_dropout=0.0, attention_dropout=0.0, params_dtype=torch.float32,
        use_cpu_initialization=True, bias_activation_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, persist_layer_norm=False, gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
    )
    return TransformerConfig(**{**settings, **overrides})


def build_tiny_gpt_moe(seed: int = 0, spec: TinyGPTMoE = TinyGPTMoE(), **config_overrides) -> torch.nn.Module:
    """A freshly initialised tiny megatron-core ``GPTModel`` (fp32, deterministic in ``seed``).

    Needs model parallelism initialised (``ensure_model_parallel``); on CPU that installs the shim first.
    """
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    if not parallel_state.model_parallel_is_initialized():
        ensure_model_parallel(dict(tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                                   expert_model_parallel_size=1, expert_tensor_parallel_size=1,
                                   context_parallel_size=1))
    torch.manual_seed(seed)
    _seed_rng_tracker(seed)
    config = tiny_transformer_config(spec, **{**live_parallel_config(), **config_overrides})
    layer_spec = get_gpt_layer_local_spec(num_experts=spec.num_moe_experts, moe_grouped_gemm=False,
                                          normalization="RMSNorm")
    model = GPTModel(config=config, transformer_layer_spec=layer_spec, vocab_size=spec.vocab_size,
                     max_sequence_length=spec.max_sequence_length, position_embedding_type="rope",
                     share_embeddings_and_output_weights=False,
                     pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage())
    return model.eval()


def live_parallel_config() -> dict[str, Any]:
    """``TransformerConfig`` parallel fields of the live model-parallel groups (a model must be built to match)."""
    from megatron.core import parallel_state

    ep = parallel_state.get_expert_model_parallel_world_size()
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    return {
        "tensor_model_parallel_size": parallel_state.get_tensor_model_parallel_world_size(),
        "pipeline_model_parallel_size": pp,
        "expert_model_parallel_size": ep,
        "expert_tensor_parallel_size": parallel_state.get_expert_tensor_parallel_world_size(),
        # alltoall needs CUDA streams; allgather dispatches over EP ranks too and runs on CPU
        "moe_token_dispatcher_type": "alltoall" if ep > 1 and torch.cuda.is_available() else "allgather",
        **({"pipeline_dtype": torch.float32} if pp > 1 else {}),
    }


def _seed_rng_tracker(seed: int) -> None:
    if torch.cuda.is_available():
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(seed)
    else:
        from repro.train.megatron.cpu_shim import seed_model_parallel_rng

        seed_model_parallel_rng(seed)


def seeded_full_tensor(seed: int):
    """``(full_name, shape) -> tensor`` of a layout-independent initialisation: N(0, 0.02) per tensor from a
    generator seeded by (seed, name); norm weights 1. Every rank draws the same full tensor and keeps its shard."""

    def make(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if "layernorm" in name or name.endswith("norm.weight"):
            return torch.ones(shape)
        generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        return torch.randn(shape, generator=generator) * 0.02

    return make


def provider(recipe) -> torch.nn.Module:
    """``actor.model_provider`` of the CPU megatron recipes: this rank's tiny GPT/MoE (vocab padded to 32 so
    it divides TP 2 and 4) with the recipe's sequence parallelism and recompute, weights from
    ``seeded_full_tensor(recipe.seed)``."""
    from repro.train.megatron.config import megatron_layout

    layout = megatron_layout(recipe)["transformer"]
    recipe_fields = ("sequence_parallel", "recompute_granularity", "recompute_method", "recompute_num_layers")
    model = build_tiny_gpt_moe(seed=recipe.seed, spec=TinyGPTMoE(vocab_size=32),
                               **{k: layout[k] for k in recipe_fields})
    load_full_weights(model, seeded_full_tensor(recipe.seed), source="seeded tiny GPT/MoE")
    return model
