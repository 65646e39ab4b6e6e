"""Write a DeepSeek-V4 checkpoint folder in either layout, from a transformers model's state dict.

    write_checkpoint(model, tokenizer, out, layout="deepseek", dtype=torch.bfloat16, mtp_layers=1)

``deepseek`` is the release's layout (``repro.model.layouts``): its tensor names, its dtypes (the tensors the release
keeps in FP32 stay FP32, tid2eid stays int64, the rest in ``dtype``), its config.json keys
(``repro.model.release_config``), and optionally the MTP layer ``mtp.0.*`` that the release ships and no trainer
uses. ``hf`` writes the module's own state-dict names with transformers' config.json. Both load with
``AutoModelForCausalLM.from_pretrained`` (transformers renames the release's names on load).

transformers' ``save_pretrained`` is not used: for DeepSeek-V4 it writes neither layout (see layouts.py).
Everything goes to a temp folder renamed into place, so a reader never sees half a checkpoint.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from safetensors.torch import save_file

from repro.errors import CheckpointError
from repro.model import layouts
from repro.owned import check_replaceable
from repro.model.release_config import release_config
from repro.model.tiny import build_tiny_model
from repro.model.tokenizer import build_tiny_tokenizer

MODEL_MARKER = ".repro-model.json"  # what shows a model folder is one repro wrote (and may replace)

MTP_SEED_OFFSET = 104729  # the MTP layer's init stream is independent of the main model's


def mtp_layer(config, seed: int, index: int = 0) -> dict[str, torch.Tensor]:
    """A seeded MTP layer in release names (``mtp.<index>.*``), shaped as the release's.

    The release's MTP layer is one decoder block (sliding attention, a top-k MoE) plus its input projections
    ``e_proj``/``h_proj`` with norms ``enorm``/``hnorm``, an output ``norm`` and an mHC head ``hc_head_*``
    (vLLM's ``amd/mtp.py`` names these). Its block is initialised like a layer of the main model.
    """
    block = build_tiny_model(seed + MTP_SEED_OFFSET + index, num_hidden_layers=1, layer_types=["sliding_attention"],
                             mlp_layer_types=["moe"], vocab_size=config.vocab_size)
    prefix = f"mtp.{index}."
    out = {}
    for name, tensor in layouts.to_release(block.state_dict()).items():
        if name.startswith("layers.0."):
            out[prefix + name.removeprefix("layers.0.")] = tensor.clone()
        elif name.startswith("hc_head_"):
            out[prefix + name] = tensor.clone()
    generator = torch.Generator().manual_seed(seed + MTP_SEED_OFFSET + index)
    hidden = config.hidden_size
    for proj in ("e_proj", "h_proj"):
        out[f"{prefix}{proj}.weight"] = torch.randn(hidden, hidden, generator=generator) * config.initializer_range
    for norm in ("enorm", "hnorm", "norm"):
        out[f"{prefix}{norm}.weight"] = torch.ones(hidden)
    return dict(sorted(out.items()))


def stored_dtype(name: str, tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """The dtype a tensor is written in: FP32 for what the release keeps FP32, integers as they are, else ``dtype``."""
    if not tensor.is_floating_point() or dtype is None:
        return tensor.dtype
    return torch.float32 if layouts.keeps_fp32(name) else dtype


def checkpoint_tensors(state: dict[str, torch.Tensor], layout: str, dtype: torch.dtype | None,
                       mtp: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The named tensors of a checkpoint in ``layout`` (release order for ``deepseek``), each in its stored dtype."""
    if layout not in layouts.LAYOUTS:
        raise ValueError(f"layout must be one of {layouts.LAYOUTS}, got {layout!r}")
    if layout == layouts.HF and mtp:
        raise ValueError("layout 'hf' has no MTP layer (transformers' DeepseekV4ForCausalLM has no MTP module)")
    named = dict(layouts.iter_release(state)) if layout == layouts.DEEPSEEK else dict(state)
    named.update(mtp or {})
    return {n: t.detach().to(stored_dtype(n, t, dtype)).contiguous() for n, t in named.items()}


def shard(tensors: dict[str, torch.Tensor], max_shard_bytes: int | None) -> list[dict[str, torch.Tensor]]:
    """Consecutive groups of at most ``max_shard_bytes`` (a bigger tensor gets a shard of its own)."""
    if not max_shard_bytes:
        return [tensors]
    shards, size = [{}], 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards


def write_tensors(folder: Path, tensors: dict[str, torch.Tensor], max_shard_bytes: int | None = None) -> None:
    """``model.safetensors``, or numbered shards plus ``model.safetensors.index.json``."""
    groups = shard(tensors, max_shard_bytes)
    if len(groups) == 1:
        save_file(groups[0], folder / "model.safetensors", metadata={"format": "pt"})
        return
    weight_map = {}
    for i, group in enumerate(groups, 1):
        file = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        save_file(group, folder / file, metadata={"format": "pt"})
        weight_map.update({name: file for name in group})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def config_json(config, layout: str, dtype: torch.dtype | None, mtp_layers: int) -> dict:
    name = str(dtype or torch.float32).removeprefix("torch.")
    if layout == layouts.DEEPSEEK:
        return release_config(config, mtp_layers=mtp_layers, torch_dtype=name)
    return {**json.loads(config.to_json_string(use_diff=False)), "dtype": name}


def write_checkpoint(model, tokenizer, out_dir: str | Path, *, layout: str = layouts.DEEPSEEK,
                     dtype: torch.dtype | None = torch.bfloat16, mtp_layers: int = 0, seed: int = 0,
                     max_shard_bytes: int | None = None, extra_files: dict[str, str] | None = None,
                     tensors: dict[str, torch.Tensor] | None = None, config: dict | None = None,
                     max_new_tokens: int | None = None) -> Path:
    """Write ``model`` (a DeepseekV4ForCausalLM) + ``tokenizer`` to ``out_dir`` in ``layout``, atomically.

    ``dtype`` None keeps every tensor's dtype. ``tensors`` / ``config`` replace the computed ones (e.g. an
    FP8-quantised tensor set with its quantization_config); ``extra_files`` are name -> text.
    """
    from transformers import GenerationConfig

    if mtp_layers not in (0, 1):
        raise ValueError(f"mtp_layers must be 0 or 1 (the release ships one), got {mtp_layers}")
    if tensors is None:
        mtp = mtp_layer(model.config, seed) if mtp_layers else None
        tensors = checkpoint_tensors(model.state_dict(), layout, dtype, mtp)
    config = config if config is not None else config_json(model.config, layout, dtype, mtp_layers)
    with staged_folder(out_dir, extra_files) as tmp:
        write_tensors(tmp, tensors, max_shard_bytes)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, max_new_tokens=max_new_tokens).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return Path(out_dir).resolve()


@contextmanager
def staged_folder(out_dir: str | Path, extra_files: dict[str, str] | None = None,
                  replace: bool = True) -> Iterator[Path]:
    """A temp folder beside ``out_dir`` to write a checkpoint into; on success ``extra_files`` (name -> text) are
    added and it is renamed onto ``out_dir``; on any failure it is removed and ``out_dir`` is left as it was.
    ``replace=False``: an ``out_dir`` that exists by then is refused (CheckpointError naming it), not replaced."""
    out = Path(out_dir).resolve()
    if replace:  # refused before anything is built: only a model folder repro wrote is replaced (repro.owned)
        check_replaceable(Path(out_dir), ours=is_model_folder, what="model folder", marker=MODEL_MARKER,
                          flag="name another folder with --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
        # the marker goes where a later build may replace the folder (an export is never replaced)
        marker = {MODEL_MARKER: json.dumps({"written_by": "repro"}) + "\n"} if replace else {}
        for name, text in {**(extra_files or {}), **marker}.items():
            (tmp / name).write_text(text)
        tmp.chmod(0o755)  # mkdtemp makes a private folder; a shipped checkpoint is read like any other file
        for file in tmp.iterdir():
            file.chmod(0o644)
        if replace:
            replace_dir(tmp, out)
        elif out.exists():
            raise CheckpointError(f"{out} already exists; nothing was written to it (choose a new output folder)")
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def is_model_folder(folder: Path) -> bool:
    """A model folder repro wrote: its marker, or (a warm start written before the marker) its warmstart.json."""
    return (folder / MODEL_MARKER).is_file() or (folder / "warmstart.json").is_file()


def replace_dir(new: Path, final: Path) -> None:
    """Rename ``new`` onto ``final``; a rename is atomic only onto a missing path, so an old folder (one repro
    wrote: ``staged_folder`` checks) goes aside under a name no one else holds."""
    old = None
    if final.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
        final.rename(old)  # over the empty folder just made
    new.rename(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def build_tiny_checkpoint(out_dir, seed: int = 0, max_shard_size: str | int = "1MB", layout: str = "deepseek",
                          mtp_layers: int = 0):
    """The seeded tiny DeepSeek-V4 as the release ships the BF16 model (its layout, names and dtypes, several
    shards with an index) with its tokenizer: the default input of notebook 01 and of the FP8 tests. Several of
    its projections are 64 wide, so the FP8 edge-block path (shapes that are not multiples of 128) is exercised
    on real tensors. ``layout="hf"`` writes transformers' in-memory names instead."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return write_checkpoint(build_tiny_model(seed), build_tiny_tokenizer(), out_dir, layout=layout,
                            dtype=torch.bfloat16, mtp_layers=mtp_layers, seed=seed,
                            max_shard_bytes=shard_bytes(max_shard_size))


def shard_bytes(size: str | int) -> int:
    """"1MB" / "2MB" / "500KB" (powers of ten, as transformers' max_shard_size) or a byte count."""
    if isinstance(size, int):
        return size
    for unit, factor in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if size.upper().endswith(unit):
            return int(float(size[: -len(unit)]) * factor)
    return int(size)
