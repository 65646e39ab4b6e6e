"""DeepSeek-V4 weight names: Hugging Face (transformers 5.24 in-memory layout) <-> Megatron (DSV4 layer spec).

Megatron-core has no DeepSeek-V4 layers; a cluster run builds its ``GPTModel`` from a DSV4 layer spec (LumenRL's
``megatron_lumen_dsv4`` engine on ROCm/Megatron-LM with a DSV4 patch). The Megatron-side names below follow that
spec's module tree: ``embedding.word_embeddings``, ``decoder.layers.<L>.{input_layernorm, self_attention.*,
pre_mlp_layernorm, mlp.router, mlp.experts.linear_fc{1,2}.weight<e>, mlp.shared_experts.linear_fc{1,2}}``,
the hyper-connection parameters ``hc_{attn,ffn}_{fn,base,scale}`` on each layer, ``decoder.final_layernorm``,
``decoder.hc_head_params.*`` and ``output_layer``. Layer indices are global (``L`` of the HF model); a pipeline
stage numbers its own layers from 0, so a PP rank subtracts its first layer before looking a name up.

The Hugging Face side is what ``DeepseekV4ForCausalLM.state_dict()`` holds; the table itself is written against
the release's on-disk names and converted through ``repro.model.layouts`` (one renaming for the whole project), and
``megatron_state_to_release`` exports in release names. LumenRL's spec also names each attention norm a second
time, ``q_norm._norm.weight`` / ``kv_norm._norm.weight`` (``NORM_ALIASES``). Three kinds of entries:

  1:1      one HF tensor is one Megatron tensor (renamed);
  split    ``mlp.experts.gate_up_proj`` [E, 2I, H] and ``mlp.experts.down_proj`` [E, H, I] are E Megatron tensors
           ``linear_fc1.weight<e>`` / ``linear_fc2.weight<e>`` (expert e's slice; gate rows then up rows, the
           order Megatron's gated-linear-unit fc1 splits in);
  fused    ``mlp.shared_experts.gate_proj`` and ``up_proj`` are one Megatron ``shared_experts.linear_fc1.weight``
           (gate rows then up rows).

Pure functions on names and CPU tensors: no megatron import, no process group.
"""

from __future__ import annotations

import re

import torch

from repro.errors import ReproError
from repro.model import layouts


class NameMappingError(ReproError):
    """A weight name or tensor that the DeepSeek-V4 HF <-> Megatron mapping does not know or cannot place."""


# Top-level (non-layer) 1:1 names: release name -> Megatron name.
_GLOBAL_RELEASE = {
    "embed.weight": "embedding.word_embeddings.weight",
    "norm.weight": "decoder.final_layernorm.weight",
    "head.weight": "output_layer.weight",
    "hc_head_fn": "decoder.hc_head_params.hc_head_fn",
    "hc_head_base": "decoder.hc_head_params.hc_head_base",
    "hc_head_scale": "decoder.hc_head_params.hc_head_scale",
}

# Per-layer 1:1 names: suffix after the release's ``layers.<L>.`` -> suffix after ``decoder.layers.<L>.``.
# The Megatron side is close to the release's own spelling (LumenRL's DSV4 spec keeps wq_a, wkv, compressor.ape).
_LAYER_RELEASE = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "pre_mlp_layernorm.weight",
    "hc_attn_fn": "hc_attn_fn",
    "hc_attn_base": "hc_attn_base",
    "hc_attn_scale": "hc_attn_scale",
    "hc_ffn_fn": "hc_ffn_fn",
    "hc_ffn_base": "hc_ffn_base",
    "hc_ffn_scale": "hc_ffn_scale",
    "attn.attn_sink": "self_attention.attn_sink",
    "attn.wq_a.weight": "self_attention.wq_a.weight",
    "attn.q_norm.weight": "self_attention.q_norm.weight",
    "attn.wq_b.weight": "self_attention.wq_b.weight",
    "attn.wkv.weight": "self_attention.wkv.weight",
    "attn.kv_norm.weight": "self_attention.kv_norm.weight",
    "attn.wo_a.weight": "self_attention.wo_a.weight",
    "attn.wo_b.weight": "self_attention.wo_b.weight",
    # compressor (CSA and HCA layers)
    "attn.compressor.ape": "self_attention.compressor.ape",
    "attn.compressor.wkv.weight": "self_attention.compressor.wkv.weight",
    "attn.compressor.wgate.weight": "self_attention.compressor.wgate.weight",
    "attn.compressor.norm.weight": "self_attention.compressor.norm.weight",
    # Lightning Indexer (CSA layers): its own compressor and scorer
    "attn.indexer.compressor.ape": "self_attention.indexer.compressor.ape",
    "attn.indexer.compressor.wkv.weight": "self_attention.indexer.compressor.wkv.weight",
    "attn.indexer.compressor.wgate.weight": "self_attention.indexer.compressor.wgate.weight",
    "attn.indexer.compressor.norm.weight": "self_attention.indexer.compressor.norm.weight",
    "attn.indexer.wq_b.weight": "self_attention.indexer.linear_wq_b.weight",
    "attn.indexer.weights_proj.weight": "self_attention.indexer.linear_weights_proj.weight",
    # MoE router (top-k layers: weight + selection bias; hash layers: weight + frozen token->expert table)
    "ffn.gate.weight": "mlp.router.weight",
    "ffn.gate.bias": "mlp.router.expert_bias",
    "ffn.gate.tid2eid": "mlp.router.tid2eid",
    "ffn.shared_experts.w2.weight": "mlp.shared_experts.linear_fc2.weight",
}
# LumenRL's DSV4 spec wraps the two attention norms: the same tensor also appears as ``<norm>._norm.weight``
# (its bridge writes both names into the Megatron state dict). Alias -> the name it duplicates.
NORM_ALIASES = {
    "self_attention.q_norm._norm.weight": "self_attention.q_norm.weight",
    "self_attention.kv_norm._norm.weight": "self_attention.kv_norm.weight",
}
# The same table in transformers' in-memory names (the layouts module knows the renaming).
_GLOBAL = {layouts.hf_name(rel): meg for rel, meg in _GLOBAL_RELEASE.items()}
_LAYER = {layouts.hf_name(f"layers.0.{rel}").removeprefix("model.layers.0."): meg
          for rel, meg in _LAYER_RELEASE.items()}
_LAYER_BACK = {meg: hf for hf, meg in _LAYER.items()}

_SPLIT = {"mlp.experts.gate_up_proj": "mlp.experts.linear_fc1.weight",
          "mlp.experts.down_proj": "mlp.experts.linear_fc2.weight"}
_SPLIT_BACK = {meg: hf for hf, meg in _SPLIT.items()}
_FUSED_PARTS = ("mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight")
_FUSED = "mlp.shared_experts.linear_fc1.weight"

_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_MEG_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_MEG_EXPERT = re.compile(r"^(mlp\.experts\.linear_fc[12]\.weight)(\d+)$")


def hf_to_megatron(name: str, num_experts: int) -> list[str]:
    """The Megatron tensor name(s) the HF tensor ``name`` becomes (E names for a split expert tensor)."""
    if name in _GLOBAL:
        return [_GLOBAL[name]]
    match = _HF_LAYER.match(name)
    if match:
        layer, suffix = match.groups()
        prefix = f"decoder.layers.{layer}."
        if suffix in _LAYER:
            return [prefix + _LAYER[suffix]]
        if suffix in _SPLIT:
            if num_experts < 1:
                raise NameMappingError(f"{name}: num_experts must be >= 1, got {num_experts}")
            return [f"{prefix}{_SPLIT[suffix]}{e}" for e in range(num_experts)]
        if suffix in _FUSED_PARTS:
            return [prefix + _FUSED]
    raise NameMappingError(f"{name}: not a DeepSeek-V4 Hugging Face weight name this mapping knows")


def megatron_to_hf(name: str) -> list[str]:
    """The HF tensor name(s) the Megatron tensor ``name`` is made from (two for the fused shared-expert fc1)."""
    for hf, meg in _GLOBAL.items():
        if name == meg:
            return [hf]
    match = _MEG_LAYER.match(name)
    if match:
        layer, suffix = match.groups()
        prefix = f"model.layers.{layer}."
        suffix = NORM_ALIASES.get(suffix, suffix)
        if suffix in _LAYER_BACK:
            return [prefix + _LAYER_BACK[suffix]]
        if suffix == _FUSED:
            return [prefix + part for part in _FUSED_PARTS]
        expert = _MEG_EXPERT.match(suffix)
        if expert:
            return [prefix + _SPLIT_BACK[expert.group(1)]]
    raise NameMappingError(f"{name}: not a Megatron DeepSeek-V4 weight name this mapping knows")


def hf_state_to_megatron(state: dict[str, torch.Tensor], norm_aliases: bool = False) -> dict[str, torch.Tensor]:
    """A whole HF state dict as Megatron tensors (experts split per expert, shared gate/up fused).

    ``norm_aliases``: also write each attention norm under LumenRL's ``<norm>._norm.weight`` (as its bridge does),
    for a spec whose norm module wraps an inner ``_norm``. A release-named state dict is accepted too."""
    if state and layouts.detect_layout(state) == layouts.DEEPSEEK:
        state = layouts.from_release(state)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        match = _HF_LAYER.match(name)
        suffix = match.group(2) if match else None
        if suffix in _SPLIT:
            if tensor.dim() != 3:
                raise NameMappingError(f"{name}: expert tensor is {tuple(tensor.shape)}, want [experts, out, in]")
            for e, target in enumerate(hf_to_megatron(name, tensor.shape[0])):
                out[target] = tensor[e]
        elif suffix in _FUSED_PARTS:
            if suffix == _FUSED_PARTS[1]:
                continue  # placed together with its gate part
            up_name = name[: -len(suffix)] + _FUSED_PARTS[1]
            if up_name not in state:
                raise NameMappingError(f"{name}: its partner {up_name} is missing, cannot fuse the shared fc1")
            out[hf_to_megatron(name, 1)[0]] = torch.cat([tensor, state[up_name]], dim=0)
        else:
            out[hf_to_megatron(name, 1)[0]] = tensor
    orphans = [n for n in state
               if n.endswith(_FUSED_PARTS[1]) and n[: -len(_FUSED_PARTS[1])] + _FUSED_PARTS[0] not in state]
    if orphans:
        raise NameMappingError(f"{orphans[0]}: its partner gate_proj is missing, cannot fuse the shared fc1")
    if norm_aliases:
        for name in list(out):
            match = _MEG_LAYER.match(name)
            for alias, main in NORM_ALIASES.items():
                if match and match.group(2) == main:
                    out[f"decoder.layers.{match.group(1)}.{alias}"] = out[name]
    return out


def megatron_state_to_hf(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of ``hf_state_to_megatron``: experts stacked back, the shared fc1 split into gate and up."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, torch.Tensor]] = {}
    for name, tensor in state.items():
        targets = megatron_to_hf(name)
        if targets[0] in out and len(targets) == 1:  # a norm alias: one tensor under two Megatron names
            if not torch.equal(out[targets[0]], tensor):
                raise NameMappingError(f"{name}: differs from the tensor it aliases ({targets[0]})")
            continue
        suffix = _MEG_LAYER.match(name).group(2) if _MEG_LAYER.match(name) else None
        expert = _MEG_EXPERT.match(suffix) if suffix else None
        if expert:
            experts.setdefault(targets[0], {})[int(expert.group(2))] = tensor
        elif len(targets) == 2:
            if tensor.shape[0] % 2:
                raise NameMappingError(f"{name}: fused gate/up has an odd row count {tensor.shape[0]}")
            out[targets[0]], out[targets[1]] = tensor.chunk(2, dim=0)
        else:
            out[targets[0]] = tensor
    for hf_name, parts in experts.items():
        missing = sorted(set(range(max(parts) + 1)) - set(parts))
        if missing:
            raise NameMappingError(f"{hf_name}: Megatron experts {missing} are missing, cannot stack")
        out[hf_name] = torch.stack([parts[e] for e in range(len(parts))])
    return out


def megatron_state_to_release(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Megatron tensors in the DeepSeek-V4 release's names: what a trainer serving a release folder exports."""
    return layouts.to_release(megatron_state_to_hf(state))
