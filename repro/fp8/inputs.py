"""The input side of a conversion: is this a causal-LM checkpoint, which shards, and what each tensor becomes.

Everything here reads only config.json, the index and the shard headers, so it runs before anything is
written: bad input fails here with an error naming the file and tensor, and leaves no output behind.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from repro.errors import CheckpointError
from repro.fp8.mxfp4 import PACKED_FP4
from repro.fp8.quant import BLOCK_SIZE, FP8Format
from repro.fp8.rules import SCALE_SUFFIXES, decide, decision_table, pair_scales, release_scale_name, scale_name
from repro.fp8.safetensors_io import TensorInfo, read_header
from repro.fp8.stream import FP4_ON_GFX942, check_input_dtype, planned_outputs
from repro.model import layouts
from repro.model.layouts import Part

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
QUANTISE, FN_TO_FNUZ = "quantise", "fn->fnuz"


@dataclass
class ShardPlan:
    """One input shard: its tensors (file order) and the output tensors planned for it."""

    name: str
    src: str
    tensors: list[TensorInfo]
    outputs: list[tuple[str, torch.dtype, tuple]]
    fingerprint: dict
    # per input tensor, the output tensors it is read as (DeepSeek-V4 in-memory input: release names, stacked
    # experts cut per expert); None: each tensor is read under its own name
    parts: list[list[Part]] | None = None
    scales: dict[str, str] = field(default_factory=dict)  # fn->fnuz: scale name -> weight name, whole checkpoint

    def items(self, read, place=None):
        """(name, tensor) pairs to convert, given ``read(info) -> tensor``; with ``place(info) -> (tensor,
        fill)``, (name, tensor, fill) triples whose tensors are read later by fill (see `stream.quantize_tensors`),
        except those cut into parts, which are read whole."""
        for i, info in enumerate(self.tensors):
            if self.parts is None and place is not None:
                yield info.name, *place(info)
                continue
            tensor = read(info)
            if self.parts is None:
                yield info.name, tensor
            else:
                for part in self.parts[i]:
                    yield part.name, part.select(tensor)


def read_config(src: Path, fmt: FP8Format) -> tuple[dict, str]:
    """config.json of a causal LM; the mode is fn->fnuz for an FP8 checkpoint asked to become e4m3fnuz."""
    path = src / CONFIG
    require_folder(src)
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing (an HF checkpoint folder has a config.json)") from None
    except ValueError as err:
        raise CheckpointError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    archs = config.get("architectures") or []
    if not any(str(a).endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        if archs or not _is_causal_model_type(config.get("model_type")):
            raise CheckpointError(
                f"{path}: not a causal LM (architectures={archs}, model_type={config.get('model_type')!r}); "
                "expected e.g. DeepseekV4ForCausalLM"
            )
    qc = config.get("quantization_config")
    if not qc:
        return config, QUANTISE
    if fmt.name == "e4m3fnuz" and is_deepseek_v4(config) and expert_dtype(config) == "fp4":
        raise CheckpointError(f"{path}: this DeepSeek-V4 checkpoint (expert_dtype "
                              f"{config.get('expert_dtype', 'absent, which vLLM reads as fp4')}) {FP4_ON_GFX942}")
    if fmt.name == "e4m3fnuz" and qc.get("quant_method") == "fp8" and qc.get("fmt", "e4m3") == "e4m3":
        return config, FN_TO_FNUZ
    raise CheckpointError(
        f"{path}: checkpoint is already quantised ({qc.get('quant_method')}, {qc.get('fmt')}); the input must be "
        "BF16, or e4m3fn FP8 with format e4m3fnuz"
    )


def is_deepseek_v4(config: dict) -> bool:
    return config.get("model_type") == "deepseek_v4"


def expert_dtype(config: dict) -> str:
    """How a quantised DeepSeek-V4 stores routed experts, as vLLM reads it: top-level ``expert_dtype`` (also
    accepted inside quantization_config, where transformers moves it), and "fp4" when absent
    (vllm/models/deepseek_v4/quant_config.py, 0.25.1 and 0.32)."""
    return str(config.get("expert_dtype") or (config.get("quantization_config") or {}).get("expert_dtype") or "fp4")


def _is_causal_model_type(model_type) -> bool:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def shard_files(src: Path) -> list[Path]:
    """The shards: those the index names (each must exist), else every *.safetensors in the folder."""
    index = src / INDEX
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise CheckpointError(f"{index}: corrupt index ({err!r})") from None
        for name in names:
            if not (src / name).is_file():
                raise CheckpointError(f"{src / name}: missing shard named in {index}")
        return [src / n for n in names]
    require_folder(src)
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{src}: no *.safetensors files")
    return files


def require_folder(src: Path) -> None:
    """``src`` exists and is a folder, or an error that says which it is not."""
    if not src.exists():
        raise CheckpointError(f"{src}: does not exist")
    if not src.is_dir():
        raise CheckpointError(f"{src}: not a checkpoint folder (a file; give the folder that holds config.json)")


def plan_shards(src: Path, fmt: FP8Format, mode: str, block_size: int = BLOCK_SIZE,
                config: dict | None = None) -> list[ShardPlan]:
    """Read every shard header and decide every output tensor, failing on anything unexpected.

    A DeepSeek-V4 input (``config``) is written in the release's names whatever its layout, with `.scale` block
    scales: what vLLM's DeepSeek-V4 loader maps (``docs/checkpoint-layouts.md``)."""
    index = src / INDEX
    weight_map = json.loads(index.read_text())["weight_map"] if index.exists() else None
    headers, seen = [], {}
    for path in shard_files(src):
        infos, _ = read_header(path)
        for info in infos:
            if info.name in seen:
                raise CheckpointError(f"{path}: tensor {info.name} also in {seen[info.name]}")
            seen[info.name] = path.name
        headers.append((path, infos))
    if weight_map is not None:
        for name, shard in weight_map.items():
            if seen.get(name) != shard:
                raise CheckpointError(f"{index}: tensor {name} is listed in {shard} but not found there")
    v4 = config is not None and is_deepseek_v4(config)
    layout = layouts.detect_layout(seen, where=str(src)) if v4 and mode == QUANTISE else None
    scales = _fnuz_scales(headers) if mode == FN_TO_FNUZ else {}
    shards = []
    for path, infos in headers:
        outputs, parts = [], []
        for info in infos:
            if mode == FN_TO_FNUZ:
                dtype = fmt.dtype if info.dtype == torch.float8_e4m3fn else info.dtype
                outputs.append((info.name, dtype, info.shape))
                continue
            pieces = (layouts.release_parts(info.name, info.shape) if layout == layouts.HF
                      else [layouts.Part(info.name, info.shape)])
            parts.append(pieces)
            for piece in pieces:
                check_input_dtype(piece.name, info.dtype, decide(piece.name, piece.shape, info.dtype), str(path))
                outputs += planned_outputs(piece.name, piece.shape, info.dtype, fmt, block_size=block_size,
                                           scale_namer=release_scale_name if v4 else scale_name)
        st = path.stat()
        shards.append(ShardPlan(path.name, str(path), infos, outputs, {"size": st.st_size, "mtime_ns": st.st_mtime_ns},
                                parts=parts if layout == layouts.HF else None, scales=scales))
    return shards


def _fnuz_scales(headers) -> dict[str, str]:
    """Every block scale of an e4m3fn checkpoint, paired with its weight; refuses what fn->fnuz cannot convert."""
    dtypes = {info.name: info.dtype for path, infos in headers for info in infos}
    where = {info.name: path for path, infos in headers for info in infos}
    for name, dtype in dtypes.items():
        if dtype in (torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz):
            raise CheckpointError(f"{where[name]}: tensor {name}: unexpected dtype {dtype} in an e4m3fn checkpoint")
    scales = pair_scales(dtypes)
    owners = set(scales.values())
    for name, dtype in dtypes.items():
        if dtype == torch.float8_e4m3fn and name not in owners:
            looked = ", ".join(f"{name.removesuffix('weight')}{suffix}" for suffix, _ in SCALE_SUFFIXES[:3])
            raise CheckpointError(f"{where[name]}: FP8 tensor {name} has no block scale (looked for {looked})")
        if dtype in PACKED_FP4 and name in owners:
            raise CheckpointError(f"{where[name]}: tensor {name} {FP4_ON_GFX942}")
    return scales


def plan_table(src: str | Path):
    """Every tensor of a checkpoint with its decision and the reason, as a DataFrame.

    A high-precision checkpoint: what the converter would do (fp8 or keep). An already-quantised one, such as the
    official DeepSeek-V4 release: what each tensor is stored as (fp8, fp4, scale, keep)."""
    import pandas as pd

    src = Path(src)
    rows = []
    for path in shard_files(src):
        infos, _ = read_header(path)
        rows += [(t.name, t.shape, t.dtype) for t in infos]
    rows.sort()
    scales = pair_scales({n: d for n, _, d in rows})
    if not scales:
        return decision_table(rows)
    owners = set(scales.values())
    table = []
    for name, shape, dtype in rows:
        kind = str(dtype).removeprefix("torch.")
        if name in scales:
            encoding = "E8M0, powers of two" if dtype == torch.float8_e8m0fnu else kind
            action, reason = "scale", f"block scale of {scales[name]} ({encoding})"
        elif name in owners and dtype in PACKED_FP4:
            action, reason = "fp4", "MXFP4 e2m1, two values a byte, one E8M0 scale per 32 values"
        elif name in owners:
            action, reason = "fp8", f"stored {kind}, one scale per 128x128 block"
        else:
            decision = decide(name, shape, dtype)
            action, reason = "keep", decision.reason if not decision.quantise else "stored in high precision"
        table.append({"name": name, "shape": tuple(shape), "dtype": kind, "action": action, "reason": reason})
    return pd.DataFrame(table, columns=["name", "shape", "dtype", "action", "reason"])
