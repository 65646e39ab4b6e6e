"""The input side of a conversion: is this a causal-LM checkpoint, which shards, and what each tensor becomes.

Everything here reads only config.json, the index and the shard headers, so it runs before anything is
written: bad input fails here with an error naming the file and tensor, and leaves no output behind.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from repro.errors import CheckpointError
from repro.fp8.quant import BLOCK_SIZE, FP8Format
from repro.fp8.rules import decide
from repro.fp8.safetensors_io import TensorInfo, read_header
from repro.fp8.stream import check_input_dtype, planned_outputs

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


def read_config(src: Path, fmt: FP8Format) -> tuple[dict, str]:
    """config.json of a causal LM; the mode is fn->fnuz for an FP8 checkpoint asked to become e4m3fnuz."""
    path = src / CONFIG
    if not src.is_dir():
        raise CheckpointError(f"{src}: not a checkpoint folder")
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
    if fmt.name == "e4m3fnuz" and qc.get("quant_method") == "fp8" and qc.get("fmt", "e4m3") == "e4m3":
        return config, FN_TO_FNUZ
    raise CheckpointError(
        f"{path}: checkpoint is already quantised ({qc.get('quant_method')}, {qc.get('fmt')}); the input must be "
        "BF16, or e4m3fn FP8 with format e4m3fnuz"
    )


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
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{src}: no *.safetensors files")
    return files


def plan_shards(src: Path, fmt: FP8Format, mode: str, block_size: int = BLOCK_SIZE) -> list[ShardPlan]:
    """Read every shard header and decide every output tensor, failing on anything unexpected."""
    index = src / INDEX
    weight_map = json.loads(index.read_text())["weight_map"] if index.exists() else None
    shards, seen = [], {}
    for path in shard_files(src):
        infos, _ = read_header(path)
        outputs = []
        for info in infos:
            if info.name in seen:
                raise CheckpointError(f"{path}: tensor {info.name} also in {seen[info.name]}")
            seen[info.name] = path.name
            if mode == QUANTISE:
                check_input_dtype(info.name, info.dtype, decide(info.name, info.shape, info.dtype), str(path))
                outputs += planned_outputs(info.name, info.shape, info.dtype, fmt, block_size=block_size)
            else:
                if info.dtype in (torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz):
                    raise CheckpointError(f"{path}: tensor {info.name}: unexpected dtype {info.dtype} in an e4m3fn checkpoint")
                dtype = fmt.dtype if info.dtype == torch.float8_e4m3fn else info.dtype
                outputs.append((info.name, dtype, info.shape))
        st = path.stat()
        shards.append(ShardPlan(path.name, str(path), infos, outputs, {"size": st.st_size, "mtime_ns": st.st_mtime_ns}))
    if weight_map is not None:
        for name, shard in weight_map.items():
            if seen.get(name) != shard:
                raise CheckpointError(f"{index}: tensor {name} is listed in {shard} but not found there")
    return shards


def plan_table(src: str | Path):
    """Every tensor of a checkpoint with its decision (fp8 or keep) and the reason, as a DataFrame."""
    from repro.fp8.rules import decision_table

    src = Path(src)
    rows = []
    for path in shard_files(src):
        infos, _ = read_header(path)
        rows += [(t.name, t.shape, t.dtype) for t in infos]
    return decision_table(sorted(rows))
