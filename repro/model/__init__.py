"""The tiny genuine DeepSeek-V4: builder, tokenizer, safetensors checkpoints, SFT warm start, routing replay.

Names are imported lazily (transformers takes seconds to import), e.g. ``from repro.model import
tiny_checkpoint_path`` stays cheap.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "TINY_CONFIG": "repro.model.tiny",
    "tiny_config": "repro.model.tiny",
    "build_tiny_model": "repro.model.tiny",
    "parameter_count": "repro.model.tiny",
    "build_tiny_tokenizer": "repro.model.tokenizer",
    "save_checkpoint": "repro.model.hf_folder",
    "load_checkpoint": "repro.model.hf_folder",
    "load_tiny_model": "repro.model.hf_folder",
    "load_tiny_tokenizer": "repro.model.hf_folder",
    "tiny_checkpoint_path": "repro.model.assets",
    "ensure_warm_checkpoint": "repro.model.warmstart_io",
    "verify_hashes": "repro.model.assets",
    "RoutingRecorder": "repro.model.routing",
    "RoutingReplay": "repro.model.routing",
    "sampled_accuracy": "repro.model.evaluate",
    "warm_start": "repro.model.warmstart",
    "WarmStartConfig": "repro.model.warmstart",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'repro.model' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
