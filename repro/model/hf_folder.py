"""Tiny checkpoints as Hugging Face folders, safetensors only, written atomically.

A folder holds ``config.json``, ``model.safetensors`` (float32), ``generation_config.json`` and the tokenizer
files, so ``AutoModelForCausalLM.from_pretrained(folder)`` / ``AutoTokenizer.from_pretrained(folder)`` load it
offline like any Hub model. A DeepSeek-V4 is written in the release's layout by default
(``repro.model.tiny_release``; ``layout="hf"`` for transformers' own names), any other model by
``save_pretrained``. Loading records the folder's tensor names, shapes and dtypes on the model
(``repro.model.served``): the names a weight sync of that model travels under. The loader refuses
pickle-based weight files (``*.bin``, ``*.pt``, ...): loading them runs arbitrary code.
"""

from __future__ import annotations

from pathlib import Path

import torch

from repro.errors import CheckpointError
from repro.model.served import record, served_from_folder
from repro.model.tiny_release import staged_folder, write_checkpoint

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
MAX_NEW_TOKENS = 12  # "Answer: 198" + EOS, the longest tiny-math response



def save_checkpoint(model, tokenizer, out_dir: str | Path, extra_files: dict[str, str] | None = None,
                    layout: str = "deepseek", max_new_tokens: int = MAX_NEW_TOKENS) -> Path:
    """Write ``model`` (float32 safetensors) + ``tokenizer`` (+ ``extra_files``: name -> text) to ``out_dir``.

    A DeepSeek-V4 goes in ``layout`` ("deepseek": the release's names and config keys; "hf": transformers'
    names). Everything goes to a temp folder next to ``out_dir`` that is renamed into place, so a reader never
    sees a half-written checkpoint."""
    if getattr(model.config, "model_type", None) == "deepseek_v4":
        return write_checkpoint(model, tokenizer, out_dir, layout=layout, dtype=torch.float32,
                                extra_files=extra_files, max_new_tokens=max_new_tokens)
    from transformers import GenerationConfig

    with staged_folder(out_dir, extra_files) as tmp:
        model.generation_config = GenerationConfig(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            max_new_tokens=max_new_tokens,
        )
        model.float().save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return Path(out_dir).resolve()


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
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a "Loading weights" bar per worker per load is noise in a run's log
    path = check_safetensors_only(folder)
    # DeepSeek-V4 names travel with the folder; read first, so a folder whose names mix layouts fails by name.
    # Other models keep their state-dict names (transformers renames e.g. Qwen3-MoE's experts on load).
    served = served_from_folder(path) if _model_type(path) == "deepseek_v4" else None
    model = AutoModelForCausalLM.from_pretrained(
        path, use_safetensors=True, local_files_only=True, dtype=dtype, attn_implementation="eager"
    )
    if served is not None:
        record(model, served)
    return model.eval()


def _model_type(folder: Path) -> str | None:
    import json

    try:
        return json.loads((folder / "config.json").read_text()).get("model_type")
    except ValueError as err:
        raise CheckpointError(f"{folder / 'config.json'}: not valid JSON ({err})") from None


def load_tiny_tokenizer(folder: str | Path):
    from transformers import AutoTokenizer

    path = Path(folder)
    if not (path / "tokenizer.json").is_file():
        raise CheckpointError(f"{path / 'tokenizer.json'} is missing")
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def load_checkpoint(folder: str | Path, dtype: torch.dtype = torch.float32):
    """``(model, tokenizer)`` from a tiny checkpoint folder."""
    return load_tiny_model(folder, dtype), load_tiny_tokenizer(folder)
