"""`repro build-tiny`: write a randomly initialised (seeded) tiny DeepSeek-V4 checkpoint + tokenizer, or
(``--arch qwen3-moe``) the tiny Qwen3-MoE with which the Megatron lane runs `repro launch` on CPU.

    python -m repro build-tiny --out runs/tiny-v4                       # the release's layout, BF16
    python -m repro build-tiny --out runs/tiny-v4-mtp --mtp             # ... with the release's MTP layer
    python -m repro build-tiny --out runs/tiny-v4-hf --layout hf        # transformers' in-memory names
    python -m repro build-tiny --out runs/tiny-v4-fp8 --official-fp8    # deepseek-ai's FP8 + MXFP4 storage
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="checkpoint folder to write (replaced atomically)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weight init and hash-routing table")
    parser.add_argument("--arch", choices=["deepseek-v4", "qwen3-moe"], default="deepseek-v4",
                        help="deepseek-v4 (the tiny recipe's model) or qwen3-moe (megatron-core can build it: "
                             "the Megatron trainer's CPU model)")
    parser.add_argument("--layout", choices=["deepseek", "hf"], default="deepseek",
                        help="deepseek: the release's tensor names and config keys (embed.weight, "
                             "layers.L.attn.wq_a.weight); hf: transformers' in-memory names")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                        help="dtype of the weights; what the release keeps in FP32 stays FP32 either way")
    parser.add_argument("--mtp", action="store_true", help="add the release's MTP layer (mtp.0.*; deepseek layout)")
    parser.add_argument("--official-fp8", action="store_true",
                        help="store it as deepseek-ai/DeepSeek-V4-Flash does: FP8 linears with E8M0 `.scale`, "
                             "MXFP4 routed experts (deepseek layout)")
    parser.add_argument("--fp4-storage", choices=["int8", "F4"], default="int8",
                        help="with --official-fp8: the packed experts' safetensors dtype")
    parser.add_argument("--shard-mb", type=float, default=0, help="split into shards of at most this many MB")


def run(args: argparse.Namespace) -> int:
    import sys

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one "Writing model shards" bar per save is noise in a CLI log
    if args.arch == "qwen3-moe":
        from repro.model.tiny_qwen3_moe import build_tiny_math_qwen3_moe

        print(f"wrote {build_tiny_math_qwen3_moe(args.out, seed=args.seed)} (tiny Qwen3-MoE, seed {args.seed})")
        return 0
    import torch

    from repro.model.tiny import build_tiny_model, parameter_count
    from repro.model.tiny_release import checkpoint_tensors, config_json, mtp_layer, write_checkpoint
    from repro.model.tokenizer import build_tiny_tokenizer

    if args.layout == "hf" and (args.mtp or args.official_fp8):
        print("repro build-tiny: error: --mtp and --official-fp8 need --layout deepseek (transformers' in-memory "
              "layout has no MTP module and no FP8 storage)", file=sys.stderr)
        return 2
    model = build_tiny_model(args.seed)
    dtype = getattr(torch, args.dtype)
    mtp_layers = 1 if args.mtp else 0
    tensors = config = None
    if args.official_fp8:
        from repro.fp8.official import OFFICIAL_CONFIG_KEYS, official_tensors

        mtp = mtp_layer(model.config, args.seed) if args.mtp else None
        tensors = official_tensors(checkpoint_tensors(model.state_dict(), args.layout, dtype, mtp), args.fp4_storage)
        config = {**config_json(model.config, args.layout, dtype, mtp_layers), **OFFICIAL_CONFIG_KEYS}
    folder = write_checkpoint(model, build_tiny_tokenizer(), args.out, layout=args.layout, dtype=dtype,
                              mtp_layers=mtp_layers, seed=args.seed, tensors=tensors, config=config,
                              max_shard_bytes=int(args.shard_mb * 1e6) or None)
    what = "official FP8/FP4 storage" if args.official_fp8 else args.dtype
    print(f"wrote {folder} ({parameter_count(model):,} parameters, seed {args.seed}, {args.layout} layout, {what}"
          f"{', one MTP layer' if args.mtp else ''})")
    return 0
