"""Tiny checkpoints in Hugging Face layout, safetensors only, written atomically.

A folder holds ``config.json``, ``model.safetensors`` (float32), ``generation_config.json`` and the tokenizer
files, so ``AutoModelForCausalLM.from_pretrained(folder)`` / ``AutoTokenizer.from_pretrained(folder)`` load it
offline like any Hub model. The loader refuses pickle-based weight files (``*.bin``, ``*.pt``, ...): loading
them runs arbitrary code.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

from repro.errors import CheckpointError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
MAX_NEW_TOKENS = 12  # "Answer: 198" + EOS, the longest tiny-math response



def save_checkpoint(model, tokenizer, out_dir: str | Path, extra_files: dict[str, str] | None = None) -> Path:
    """Write ``model`` (float32 safetensors) + ``tokenizer`` (+ ``extra_files``: name -> text) to ``out_dir``.

    Everything goes to a temp folder next to ``out_dir`` that is renamed into place, so a reader never sees a
    half-written checkpoint."""
    from transformers import GenerationConfig

    out = Path(out_dir).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.generation_config = GenerationConfig(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            max_new_tokens=MAX_NEW_TOKENS,
        )
        model.float().save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        # mkdtemp makes a private (0700) folder; a shipped checkpoint should be readable like any other file.
        tmp.chmod(0o755)
        for file in tmp.iterdir():
            file.chmod(0o644)
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _replace_dir(new: Path, final: Path) -> None:
    # A rename is atomic only onto a missing path: move any old folder aside first, then drop it.
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        final.rename(old)
    new.rename(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def check_safetensors_only(folder: str | Path) -> Path:
    """Raise CheckpointError unless ``folder`` has safetensors weights and no pickle-based weight file."""
    path = Path(folder)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint folder {path} does not exist")
    for file in sorted(path.iterdir()):
        if file.name.endswith(PICKLE_SUFFIXES):
            raise CheckpointError(
                f"{file} is a pickle-based weight file; only safetensors checkpoints are loaded "
                "(unpickling can run arbitrary code). Convert it to model.safetensors first."
            )
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path / 'config.json'} is missing")
    if not any(path.glob("*.safetensors")):
        raise CheckpointError(f"{path} has no *.safetensors weights (expected {path / 'model.safetensors'})")
    return path


def load_tiny_model(folder: str | Path, dtype: torch.dtype = torch.float32):
    """The model from a safetensors checkpoint folder, in eval mode (local files only, eager attention)."""
    from transformers import AutoModelForCausalLM

    path = check_safetensors_only(folder)
    model = AutoModelForCausalLM.from_pretrained(
        path, use_safetensors=True, local_files_only=True, dtype=dtype, attn_implementation="eager"
    )
    return model.eval()


def load_tiny_tokenizer(folder: str | Path):
    from transformers import AutoTokenizer

    path = Path(folder)
    if not (path / "tokenizer.json").is_file():
        raise CheckpointError(f"{path / 'tokenizer.json'} is missing")
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def load_checkpoint(folder: str | Path, dtype: torch.dtype = torch.float32):
    """``(model, tokenizer)`` from a tiny checkpoint folder."""
    return load_tiny_model(folder, dtype), load_tiny_tokenizer(folder)
