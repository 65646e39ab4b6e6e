"""`repro build-tiny`: write a randomly initialised (seeded) tiny DeepSeek-V4 checkpoint + tokenizer, or
(``--arch qwen3-moe``) the tiny Qwen3-MoE with which the Megatron lane runs `repro launch` on CPU."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="checkpoint folder to write (replaced atomically)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weight init and hash-routing table")
    parser.add_argument("--arch", choices=["deepseek-v4", "qwen3-moe"], default="deepseek-v4",
                        help="deepseek-v4 (the tiny recipe's model) or qwen3-moe (megatron-core can build it: "
                             "the Megatron trainer's CPU model)")


def run(args: argparse.Namespace) -> int:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one "Writing model shards" bar per save is noise in a CLI log
    if args.arch == "qwen3-moe":
        from repro.model.tiny_qwen3_moe import build_tiny_math_qwen3_moe

        print(f"wrote {build_tiny_math_qwen3_moe(args.out, seed=args.seed)} (tiny Qwen3-MoE, seed {args.seed})")
        return 0
    from repro.model.hf_folder import save_checkpoint
    from repro.model.tiny import build_tiny_model, parameter_count
    from repro.model.tokenizer import build_tiny_tokenizer

    model = build_tiny_model(args.seed)
    folder = save_checkpoint(model, build_tiny_tokenizer(), args.out)
    print(f"wrote {folder} ({parameter_count(model):,} parameters, seed {args.seed})")
    return 0
