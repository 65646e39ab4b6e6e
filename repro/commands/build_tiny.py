"""`repro build-tiny`: write a randomly initialised (seeded) tiny DeepSeek-V4 checkpoint + tokenizer."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="checkpoint folder to write (replaced atomically)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weight init and hash-routing table")


def run(args: argparse.Namespace) -> int:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one "Writing model shards" bar per save is noise in a CLI log
    from repro.model.checkpoint import save_checkpoint
    from repro.model.tiny import build_tiny_model, parameter_count
    from repro.model.tokenizer import build_tiny_tokenizer

    model = build_tiny_model(args.seed)
    folder = save_checkpoint(model, build_tiny_tokenizer(), args.out)
    print(f"wrote {folder} ({parameter_count(model):,} parameters, seed {args.seed})")
    return 0
