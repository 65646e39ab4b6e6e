"""DeepSeek-V4 checkpoint layouts: the release's on-disk names <-> transformers' in-memory names, the tensors the
release keeps in FP32, and which tensors are the MTP layer. The one place this knowledge lives: the trainer's
export, the rollout's update check, the FP8 converter and the Megatron name table all read it from here.

Two layouts (``LAYOUTS``):

  deepseek  the release on disk (deepseek-ai/DeepSeek-V4-Flash, RedHatAI/DeepSeek-V4-Flash-BF16):
            ``embed.weight``, ``head.weight``, ``norm.weight``, ``hc_head_{fn,base,scale}``,
            ``layers.L.{attn_norm,ffn_norm}.weight``, ``layers.L.hc_{attn,ffn}_{fn,base,scale}``,
            ``layers.L.attn.{wq_a,q_norm,wq_b,wkv,kv_norm,wo_a,wo_b}.weight``, ``layers.L.attn.attn_sink``,
            ``layers.L.attn.compressor.{ape,wkv,wgate,norm}``,
            ``layers.L.attn.indexer.{wq_b,weights_proj,compressor.*}``,
            ``layers.L.ffn.gate.{weight,bias,tid2eid}``, ``layers.L.ffn.experts.E.{w1,w2,w3}.weight``,
            ``layers.L.ffn.shared_experts.{w1,w2,w3}.weight`` and the MTP layer ``mtp.0.*``;
  hf        ``DeepseekV4ForCausalLM.state_dict()`` of transformers 5.24: ``model.layers.L.self_attn.q_a_proj.weight``,
            routed experts stacked as ``mlp.experts.gate_up_proj`` [E, 2I, H] (w1 rows, then w3 rows) and
            ``mlp.experts.down_proj`` [E, H, I]; no MTP module.

The renaming is the one transformers applies when it loads the release (``conversion_mapping.py``, entry
``deepseek_v4``). Its reverse is not: transformers 5.24's ``save_pretrained`` writes a third, mixed spelling
(``model.layers.L.attn.norm.weight`` for the attention's ``kv_norm``, ``model.embed_tokens.weight``, ``head.weight``)
that vLLM's loader cannot place, so checkpoints are written here, never through ``save_pretrained``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
import torch

from repro.errors import CheckpointError

DEEPSEEK, HF = "deepseek", "hf"
LAYOUTS = (DEEPSEEK, HF)

# Non-layer tensors: release name -> in-memory name.
_GLOBAL = {
    "embed.weight": "model.embed_tokens.weight",
    "head.weight": "lm_head.weight",
    "norm.weight": "model.norm.weight",
    "hc_head_fn": "model.hc_head.hc_fn",
    "hc_head_base": "model.hc_head.hc_base",
    "hc_head_scale": "model.hc_head.hc_scale",
}
# Per-layer tensors: suffix after ``layers.L.`` -> suffix after ``model.layers.L.``.
_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "hc_attn_fn": "attn_hc.fn",
    "hc_attn_base": "attn_hc.base",
    "hc_attn_scale": "attn_hc.scale",
    "hc_ffn_fn": "ffn_hc.fn",
    "hc_ffn_base": "ffn_hc.base",
    "hc_ffn_scale": "ffn_hc.scale",
    "attn.attn_sink": "self_attn.sinks",
    "attn.wq_a.weight": "self_attn.q_a_proj.weight",
    "attn.q_norm.weight": "self_attn.q_a_norm.weight",
    "attn.wq_b.weight": "self_attn.q_b_proj.weight",
    "attn.wkv.weight": "self_attn.kv_proj.weight",
    "attn.kv_norm.weight": "self_attn.kv_norm.weight",
    "attn.wo_a.weight": "self_attn.o_a_proj.weight",
    "attn.wo_b.weight": "self_attn.o_b_proj.weight",
    "attn.compressor.ape": "self_attn.compressor.position_bias",
    "attn.compressor.wkv.weight": "self_attn.compressor.kv_proj.weight",
    "attn.compressor.wgate.weight": "self_attn.compressor.gate_proj.weight",
    "attn.compressor.norm.weight": "self_attn.compressor.kv_norm.weight",
    "attn.indexer.wq_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
    "attn.indexer.weights_proj.weight": "self_attn.compressor.indexer.scorer.weights_proj.weight",
    "attn.indexer.compressor.ape": "self_attn.compressor.indexer.position_bias",
    "attn.indexer.compressor.wkv.weight": "self_attn.compressor.indexer.kv_proj.weight",
    "attn.indexer.compressor.wgate.weight": "self_attn.compressor.indexer.gate_proj.weight",
    "attn.indexer.compressor.norm.weight": "self_attn.compressor.indexer.kv_norm.weight",
    "ffn.gate.weight": "mlp.gate.weight",
    "ffn.gate.bias": "mlp.gate.e_score_correction_bias",
    "ffn.gate.tid2eid": "mlp.gate.tid2eid",
    "ffn.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
    "ffn.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
}
_GLOBAL_BACK = {hf: rel for rel, hf in _GLOBAL.items()}
_LAYER_BACK = {hf: rel for rel, hf in _LAYER.items()}
_REL_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_REL_EXPERT = re.compile(r"^layers\.(\d+)\.ffn\.experts\.(\d+)\.(w[123])\.weight$")
_HF_STACKED = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")

# What the release stores in FP32 (checked against the official FP8 release's headers as a third-party loader
# pins them, and LumenRL's bridge, which keeps the same tensors FP32 through training and sync).
STORED_FP32: tuple[tuple[str, str], ...] = (
    (r"(^|\.)hc_(head|attn|ffn)_(fn|base|scale)$", "mHC hyper-connection parameter"),
    (r"\.attn\.attn_sink$", "attention sink logits"),
    (r"\.compressor\.ape$", "compressor absolute position bias"),
    (r"\.ffn\.gate\.bias$", "router selection bias"),
)
_STORED_FP32 = tuple(re.compile(p) for p, _ in STORED_FP32)
MTP_REASON = ("the MTP layer (mtp.*) is not trained: transformers' DeepseekV4ForCausalLM has no MTP module "
              "(it skips mtp.* on load) and vLLM's DeepSeek-V4 loader skips mtp.* too")


class LayoutError(CheckpointError):
    """A tensor name no DeepSeek-V4 layout knows, or a folder whose names mix layouts."""


def is_mtp(name: str) -> bool:
    """True for the release's MTP layer tensors (``mtp.<i>.*``)."""
    return name.startswith("mtp.")


def keeps_fp32(name: str) -> bool:
    """True if the release stores tensor ``name`` (either layout's spelling) in FP32."""
    if name.startswith(("model.", "lm_head.")):
        if _HF_STACKED.match(name):
            return False  # routed experts: BF16 (FP4 in the official release)
        name = release_name(name)
    return any(p.search(name) for p in _STORED_FP32)


def release_name(hf_name: str) -> str:
    """The release name of a 1:1 in-memory tensor (stacked experts have several: see ``release_parts``)."""
    if hf_name in _GLOBAL_BACK:
        return _GLOBAL_BACK[hf_name]
    match = _HF_LAYER.match(hf_name)
    if match and match.group(2) in _LAYER_BACK:
        return f"layers.{match.group(1)}.{_LAYER_BACK[match.group(2)]}"
    raise LayoutError(f"{hf_name}: not a DeepSeek-V4 in-memory tensor name the release layout maps")


def hf_name(release: str) -> str:
    """The in-memory name of a 1:1 release tensor (a routed expert's w1/w2/w3 lands in a stacked tensor)."""
    if release in _GLOBAL:
        return _GLOBAL[release]
    match = _REL_LAYER.match(release)
    if match and match.group(2) in _LAYER:
        return f"model.layers.{match.group(1)}.{_LAYER[match.group(2)]}"
    raise LayoutError(f"{release}: not a DeepSeek-V4 release tensor name this layout maps")


@dataclass(frozen=True)
class Part:
    """One release tensor cut from an in-memory tensor: all of it, or expert ``expert``'s rows ``rows``.

    Plain data (no closures), so a conversion plan holding parts can cross to a worker process."""

    name: str
    shape: tuple[int, ...]
    expert: int | None = None
    rows: tuple[int, int] | None = None

    def select(self, t: torch.Tensor) -> torch.Tensor:
        if self.expert is None:
            return t
        piece = t[self.expert]
        return piece if self.rows is None else piece[self.rows[0] : self.rows[1]]


def release_parts(hf: str, shape: tuple[int, ...]) -> list[Part]:
    """The release tensors in-memory tensor ``hf`` of ``shape`` holds, in release order.

    ``mlp.experts.gate_up_proj`` [E, 2I, H] -> ``ffn.experts.e.w1`` (rows :I) and ``.w3`` (rows I:) per expert;
    ``mlp.experts.down_proj`` [E, H, I] -> ``ffn.experts.e.w2``; every other tensor -> its one release name.
    """
    stacked = _HF_STACKED.match(hf)
    if not stacked:
        return [Part(release_name(hf), tuple(shape))]
    layer, kind = stacked.groups()
    if len(shape) != 3:
        raise LayoutError(f"{hf}: stacked experts should be [experts, out, in], got {list(shape)}")
    experts, rows, cols = shape
    prefix = f"layers.{layer}.ffn.experts"
    if kind == "down_proj":
        return [Part(f"{prefix}.{e}.w2.weight", (rows, cols), e) for e in range(experts)]
    if rows % 2:
        raise LayoutError(f"{hf}: gate_up_proj has an odd row count {rows}")
    half = rows // 2
    parts = []
    for e in range(experts):
        parts.append(Part(f"{prefix}.{e}.w1.weight", (half, cols), e, (0, half)))
        parts.append(Part(f"{prefix}.{e}.w3.weight", (half, cols), e, (half, rows)))
    return parts


def to_release(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An in-memory state dict in release names (experts split, views of ``state``)."""
    out = {}
    for name, tensor in state.items():
        for part in release_parts(name, tuple(tensor.shape)):
            out[part.name] = part.select(tensor)
    return out


def from_release(state: Mapping[str, torch.Tensor], skip_mtp: bool = True) -> dict[str, torch.Tensor]:
    """Release-named tensors as an in-memory state dict (experts stacked). MTP tensors are left out."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
    for name, tensor in state.items():
        if is_mtp(name):
            if skip_mtp:
                continue
            raise LayoutError(f"{name}: {MTP_REASON}")
        expert = _REL_EXPERT.match(name)
        if expert:
            layer, e, w = expert.groups()
            experts.setdefault((layer, w), {})[int(e)] = tensor
        else:
            out[hf_name(name)] = tensor
    layers = sorted({layer for layer, _ in experts}, key=int)
    for layer in layers:
        parts = {w: experts.get((layer, w), {}) for w in ("w1", "w2", "w3")}
        count = max(len(p) for p in parts.values())
        for w, found in parts.items():
            missing = sorted(set(range(count)) - set(found))
            if missing:
                raise LayoutError(f"layers.{layer}.ffn.experts: {w} of experts {missing} is missing, cannot stack")
        base = f"model.layers.{layer}.mlp.experts"
        out[f"{base}.gate_up_proj"] = torch.stack(
            [torch.cat([parts["w1"][e], parts["w3"][e]], dim=0) for e in range(count)])
        out[f"{base}.down_proj"] = torch.stack([parts["w2"][e] for e in range(count)])
    return out


def _is_release(name: str) -> bool:
    if name.endswith(".scale"):  # an FP8/FP4 block scale, named after its weight as the release does
        name = name.removesuffix("scale") + "weight"
    layer = _REL_LAYER.match(name)
    return name in _GLOBAL or is_mtp(name) or bool(_REL_EXPERT.match(name)) or bool(layer and layer.group(2) in _LAYER)


def _is_hf(name: str) -> bool:
    layer = _HF_LAYER.match(name)
    return name in _GLOBAL_BACK or bool(_HF_STACKED.match(name)) or bool(layer and layer.group(2) in _LAYER_BACK)


def detect_layout(names: Iterable[str], where: str = "") -> str:
    """``deepseek`` or ``hf`` from a DeepSeek-V4 checkpoint's tensor names; refuses a mixed or unknown set,
    naming the tensors no layout places."""
    names = list(names)
    release = [n for n in names if _is_release(n)]
    hf = [n for n in names if _is_hf(n)]
    prefix = f"{where}: " if where else ""
    if names and len(release) == len(names):
        return DEEPSEEK
    if names and len(hf) == len(names):
        return HF
    odd = sorted(set(names) - set(release) - set(hf))
    raise LayoutError(
        f"{prefix}DeepSeek-V4 tensor names fit neither layout: {odd[:3]}{'...' if len(odd) > 3 else ''} "
        f"({len(release)} release-style, {len(hf)} in-memory-style of {len(names)}); expected the release's names "
        "(embed.weight, layers.L.attn.wq_a.weight) or transformers' (model.layers.L.self_attn.q_a_proj.weight). "
        "transformers' save_pretrained writes a mix of both (model.layers.L.attn.norm.weight): rewrite such a folder "
        "with repro.model.tiny_release.write_checkpoint"
    )


def release_order(names: Iterable[str]) -> list[str]:
    """Release names in a stable reading order: globals first, then by layer, expert, and name."""

    def key(name: str):
        expert = _REL_EXPERT.match(name)
        if expert:
            return (2, int(expert.group(1)), 1, int(expert.group(2)), expert.group(3))
        layer = _REL_LAYER.match(name)
        if layer:
            return (2, int(layer.group(1)), 0, 0, layer.group(2))
        if is_mtp(name):
            return (3, 0, 0, 0, name)
        return (1, 0, 0, 0, name)

    return sorted(names, key=key)


def iter_release(state: Mapping[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """``to_release(state)`` in ``release_order``."""
    tensors = to_release(state)
    for name in release_order(tensors):
        yield name, tensors[name]
