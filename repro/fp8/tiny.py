"""A BF16 checkpoint of the project's tiny genuine DeepSeek-V4 (`repro.model.tiny`), written in several
shards with an index, plus its tokenizer: the default input of notebook 01 and of the FP8 tests.

Several of its projections are 64 wide, so the FP8 edge-block path (shapes that are not multiples of 128)
is exercised on real tensors.
"""

from __future__ import annotations

from pathlib import Path


def build_tiny_checkpoint(out_dir: str | Path, seed: int = 0, max_shard_size: str | int = "1MB") -> Path:
    """Save the seeded tiny DeepSeek-V4 in bfloat16 (HF layout, sharded by `max_shard_size`) with its tokenizer."""
    import torch
    from transformers.utils import logging as hf_logging

    from repro.model.tiny import build_tiny_model
    from repro.model.tokenizer import build_tiny_tokenizer

    hf_logging.disable_progress_bar()
    out_dir = Path(out_dir)
    build_tiny_model(seed).to(torch.bfloat16).save_pretrained(out_dir, max_shard_size=max_shard_size)
    build_tiny_tokenizer().save_pretrained(out_dir)
    return out_dir
