"""Benchmark (not a test): the compiled BF16 quantiser against the torch ops, and its cast against torch's on
every fp32 bit pattern.

    .venv/bin/python benchmarks/bench_fp8_fused.py              # speed (1 and 2 threads), then all 2^32 patterns
    .venv/bin/python benchmarks/bench_fp8_fused.py --stride 7   # every 7th pattern (~25 s instead of ~3 min)

Speed: one 4096 x 4096 BF16 tensor (an expert-sized matrix, 32 MiB), quantised with the error check by
`quantize_block_with_error` with the compiled kernel and with the torch ops (`quant._USE_FUSED`), interleaved,
best of --repeats, on 1 and 2 threads; figures are CPU-seconds per GB of BF16 input for one thread (wall x 1)
and GB/s for two. Cast: `fused.cast_f32` against `tensor.to(float8)` on fp32 patterns 0, s, 2s, ... < 2^32.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from repro.fp8 import fused, quant  # noqa: E402


def speed(repeats: int) -> dict:
    torch.set_num_threads(1)  # as the converter: the slab threads are the parallelism
    w = (torch.randn(4096, 4096, generator=torch.Generator().manual_seed(0)) * 0.02).to(torch.bfloat16)
    gb = w.numel() * 2 / 1e9
    best: dict[str, float] = {}
    for _ in range(repeats):
        for label, use, threads in [("kernel_1t", True, 1), ("torch_1t", False, 1), ("kernel_2t", True, 2),
                                    ("torch_2t", False, 2)]:
            quant._USE_FUSED = use
            x = w.clone()
            start = time.perf_counter()
            quant.quantize_block_with_error(x, "e4m3fnuz", threads=threads, overwrite_input=True)
            best[label] = min(best.get(label, 1e9), time.perf_counter() - start)
    quant._USE_FUSED = True
    return {"kernel_cpu_s_per_gb_1thread": round(best["kernel_1t"] / gb, 3),
            "torch_cpu_s_per_gb_1thread": round(best["torch_1t"] / gb, 3),
            "kernel_gb_per_s_2threads": round(gb / best["kernel_2t"], 3),
            "torch_gb_per_s_2threads": round(gb / best["torch_2t"], 3)}


def cast_sweep(stride: int, chunk: int = 1 << 26) -> dict:
    out = {}
    for fmt in ("e4m3fn", "e4m3fnuz"):
        dtype, mismatches, checked, start = quant.get_format(fmt).dtype, 0, 0, time.perf_counter()
        for first in range(0, 1 << 32, chunk * stride):
            bits = torch.arange(first, min(first + chunk * stride, 1 << 32), stride, dtype=torch.int64)
            y = torch.where(bits >= 1 << 31, bits - (1 << 32), bits).to(torch.int32).view(torch.float32)
            mismatches += int((fused.cast_f32(y, fmt == "e4m3fnuz") != y.to(dtype).view(torch.uint8)).sum())
            checked += y.numel()
        out[fmt] = {"patterns": checked, "mismatches": mismatches, "seconds": round(time.perf_counter() - start, 1)}
        print(fmt, out[fmt], flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--stride", type=int, default=1, help="check every stride-th fp32 pattern (1: all 2^32)")
    ap.add_argument("--no-sweep", action="store_true", help="only the speed comparison")
    ap.add_argument("--out", default=str(REPO / "runs" / "bench_fp8_fused.json"))
    args = ap.parse_args()
    if fused.kernel() is None:
        raise SystemExit("the compiled quantiser could not be built here (see the warning above)")
    result = {"load_avg": os.getloadavg()[0], **speed(args.repeats)}
    print(json.dumps(result, indent=1), flush=True)
    if not args.no_sweep:
        result["cast_sweep"] = {"stride": args.stride, **cast_sweep(args.stride)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
