"""`repro convert`: BF16 HF checkpoint -> block-wise FP8 (see repro/fp8/convert.py for the guarantees).

    python -m repro convert --input ckpt-bf16 --output ckpt-fp8 --format e4m3fnuz --workers 4
    python -m repro convert --input ckpt-bf16 --list          # which tensors would be FP8, and why
    python -m repro convert --input ckpt-fp8-fn --output ckpt-fp8-fnuz --format e4m3fnuz   # vLLM's ROCm rule
"""

from __future__ import annotations

import argparse
import json
import sys

from repro.fp8.convert import ConvertOptions, convert_checkpoint
from repro.fp8.inputs import plan_table
from repro.fp8.quant import FORMATS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="HF checkpoint folder (config.json + *.safetensors)")
    parser.add_argument("--output", help="output folder (built in <output>.partial, renamed when complete)")
    parser.add_argument("--format", default="e4m3fn", choices=sorted(FORMATS),
                        help="e4m3fn (max 448: NVIDIA, MI350) or e4m3fnuz (max 240: MI300/MI308X)")
    parser.add_argument("--workers", type=int, default=1, help="shards converted in parallel processes")
    parser.add_argument("--threads", type=int, default=0,
                        help="threads quantising each tensor, per worker (default 0: the CPU cores / workers)")
    parser.add_argument("--pow2-scales", action="store_true",
                        help="round each block scale up to a power of two (UE8M0, as DeepSeek-V4 ships)")
    parser.add_argument("--max-rel-error", type=float, default=None,
                        help="fail if a tensor's ||deq-w||/||w|| exceeds this (default: the e4m3 bound, ~0.0628)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    parser.add_argument("--no-fsync", action="store_true", help="skip fsync of each finished shard")
    parser.add_argument("--list", action="store_true",
                        help="print the per-tensor plan (fp8 or keep, and why); convert nothing")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    if args.list:
        import pandas as pd

        with pd.option_context("display.max_rows", None, "display.max_colwidth", 80, "display.width", 200):
            print(plan_table(Path(args.input)).to_string(index=False))
        return 0
    if not args.output:
        print("repro convert: error: --output is required (or pass --list)", file=sys.stderr)
        return 2
    opts = ConvertOptions(fmt=args.format, pow2_scale=args.pow2_scales, workers=args.workers, threads=args.threads,
                          max_rel_error=args.max_rel_error, fsync=not args.no_fsync, overwrite=args.overwrite,
                          progress=not args.quiet and not args.json)
    result = convert_checkpoint(args.input, args.output, opts)
    s = result.summary
    out = {**s, "output": str(result.output_dir), "mode": result.mode, "format": args.format,
           "seconds": round(result.seconds, 3), "input_gb_per_s": round(result.gb_per_s, 4),
           "shard_seconds": round(result.shard_seconds, 3),
           "steady_input_gb_per_s": round(result.input_bytes / max(result.shard_seconds, 1e-9) / 1e9, 4)
           if result.shards_resumed == 0 else None,
           "shards": result.shards, "shards_resumed": result.shards_resumed,
           "peak_rss_mib": round(result.peak_rss_bytes / 2**20, 1),
           "peak_rss_main_mib": round(result.peak_rss_self_bytes / 2**20, 1)}
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{result.output_dir}: {s['tensors_fp8']} tensors FP8 ({args.format}), {s['tensors_kept']} kept; "
          f"{s['bytes_in'] / 1e6:.1f} MB -> {s['bytes_out'] / 1e6:.1f} MB ({s['size_ratio']:.3f})")
    print(f"relative error: max {s['rel_error_max']:.4f}, median {s['rel_error_median']:.4f}; "
          f"{result.shards} shards ({result.shards_resumed} resumed) in {result.seconds:.1f} s "
          f"= {result.gb_per_s:.3f} GB/s; peak RSS {result.peak_rss_bytes / 2**20:.0f} MiB")
    return 0
