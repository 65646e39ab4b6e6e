"""`repro export RUN_DIR --out FOLDER`: a run's checkpoint as a safetensors folder with config, tokenizer and a
model card (repro/run/export.py says what is exported and what is refused).

    python -m repro export runs/tiny-cpu --out exports/tiny-cpu                  # newest checkpoint, release layout
    python -m repro export runs/tiny-cpu --out exports/tiny-cpu-hf --layout hf --step 50
"""

from __future__ import annotations

import argparse
import json
import re
import sys

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KIB|MIB|GIB|TIB)?\s*$", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def shard_size(text: str) -> int:
    """'5GB', '500MB', '2GiB' or a byte count -> bytes (argparse type)."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a size such as 5GB, 500MB, 2GiB or a byte count")
    value = int(float(match.group(1)) * _UNITS[(match.group(2) or "B").upper()])
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a shard must hold at least one byte")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a repro run directory (recipe.yaml, checkpoints/step_*)")
    parser.add_argument("--out", required=True, help="the folder to create; refused if it exists")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step to export (default: the newest)")
    parser.add_argument("--layout", choices=("deepseek", "hf"), default="deepseek",
                        help="deepseek: the release's tensor names and config keys (vLLM, the DeepSeek-V4 release); "
                             "hf: transformers' names (DeepseekV4ForCausalLM.state_dict())")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16",
                        help="dtype of the floating weights; what the release keeps FP32 stays FP32")
    parser.add_argument("--max-shard-size", type=shard_size, default=5 * 10**9,
                        help="largest weight file before a new shard starts (default 5GB)")
    parser.add_argument("--model-dir", default=None,
                        help="take the tokenizer from this folder instead of the recipe's model.path")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")


def run(args: argparse.Namespace) -> int:
    import resource
    import time

    from repro.run.export import export_run

    started = time.perf_counter()
    result = export_run(args.run_dir, args.out, step=args.step, layout=args.layout, dtype=args.dtype,
                        max_shard_bytes=args.max_shard_size, model_dir=args.model_dir,
                        say=lambda line: print(line, file=sys.stderr))
    seconds = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    summary = {"output": str(result.folder), "step": result.step, "layout": result.layout, "tensors": result.tensors,
               "bytes": result.bytes, "files": result.files, "seconds": round(seconds, 3),
               "peak_rss_mib": round(peak_mib, 1)}
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"{result.folder}: step {result.step}, {result.layout} layout, {result.tensors} tensors, "
          f"{result.bytes / 1e6:.1f} MB in {seconds:.1f} s; peak RSS {peak_mib:.0f} MiB")
    print("files: " + ", ".join(result.files))
    return 0
