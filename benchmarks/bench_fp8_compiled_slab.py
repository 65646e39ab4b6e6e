"""Benchmark (not a test): the quantiser's slab pipeline fused by `torch.compile` (inductor's C++ backend)
against the eager op-by-op quantiser the converter uses, on one CPU thread.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_fp8_compiled_slab.py [--format e4m3fnuz] [--threads 1]

The fused function does the whole quantise-and-check of a [rows, K] BF16 slab (rows, K multiples of 128) in
two inductor kernels (block amax; then scale, cast, dequantise and the error sums). Inductor vectorises the
float32 -> float8_e4m3fn cast but not -> e4m3fnuz, so an fnuz slab is cast as fn(2y) (fnuz's bits are fn's
bits of twice the value), with the top code (240, fn's NaN bits) and fnuz's missing negative zero set apart;
this is checked against torch's own cast on the slabs below, not over every float32. The scale
arithmetic stays in eager torch, as in `repro.fp8.quant`. Prints, per run: cold compile time (fresh inductor
cache folder), warm-cache time (a second process on the same folder), bytes identical to the eager quantiser
(several shapes), and GB of BF16 input per CPU-second (process time, robust to other load) for both.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
BLOCK = 128


def fused_slab(x, inv, scale, fnuz: bool):
    """x [rows, K] bf16, inv/scale [rows/128, K/128] fp32 -> (q [rows, K] fp8 bytes (as e4m3fn), [||d||, ||w||,
    max(-d), max(d), NaN probe]) with d = |dequant(q)| - |w|, as `repro.fp8.quant._slab_error` defines them."""
    rows, k = x.shape
    v = x.view(rows // BLOCK, BLOCK, k // BLOCK, BLOCK).float()
    y = v * inv[:, None, :, None]
    a = v.abs()
    if fnuz:
        a_y = y.abs()
        top = a_y > 232.0
        nan = torch.copysign(torch.full_like(y, float("nan")), y)
        z = torch.where(top, nan, torch.where(a_y <= 2.0**-11, 0.0, y * 2.0))
    else:
        z = y
    q = z.to(torch.float8_e4m3fn)
    qf = q.float().abs()
    if fnuz:
        mag = torch.where(top, 240.0, qf * 0.5)
        probe = (a_y >= 248.0).float().amax() * -128.0
    else:
        mag = qf
        probe = (qf != qf).float().amax() * 127.0
    d = mag * scale[:, None, :, None] - a
    return q.view(rows, k), torch.stack([d.square().sum().sqrt(), a.square().sum().sqrt(), -d.amin(), d.amax(), probe])


def block_amax(x):
    rows, k = x.shape
    return x.view(rows // BLOCK, BLOCK, k // BLOCK, BLOCK).abs().amax(dim=(1, 3)).float()


def make_runner(fmt):
    fnuz = fmt.name == "e4m3fnuz"
    amax_c = torch.compile(block_amax)
    slab_c = torch.compile(lambda x, inv, scale: fused_slab(x, inv, scale, fnuz))

    def run(x):
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(x, 1)
        scale = (amax_c(x) / fmt.max).clamp_(min=2.0**-126)
        q, figures = slab_c(x, scale.reciprocal(), scale)
        return q.view(torch.uint8), scale, figures

    return run


def child(fmt_name: str, rows: int, repeats: int) -> dict:
    from repro.fp8.quant import get_format, quantize_block_with_error

    fmt = get_format(fmt_name)
    run = make_runner(fmt)
    start = time.perf_counter()
    run((torch.randn(256, 4096) * 0.02).bfloat16())
    compile_s = time.perf_counter() - start
    gc.freeze()  # compiled calls allocate; without this, gen-2 collections walk the compiler's heap (~45% of time)
    same = True
    g = torch.Generator().manual_seed(0)
    for shape in [(256, 4096), (2048, 4096), (4096, 2048), (512, 1024), (1024, 256)]:
        x = (torch.randn(shape, generator=g) * 0.02).bfloat16()
        x[:128, :128] *= 1e-38  # subnormal-scale blocks too
        q, s, _ = run(x)
        q_ref, s_ref, _ = quantize_block_with_error(x, fmt)
        same &= torch.equal(q, q_ref.view(torch.uint8)) and torch.equal(s, s_ref)
    x = (torch.randn(rows, 4096, generator=g) * 0.02).bfloat16()
    rates = {}
    for label, fn in (("eager", lambda: quantize_block_with_error(x, fmt)), ("compiled", lambda: run(x)[2].tolist())):
        fn()
        best = 0.0
        for _ in range(3):
            cpu = time.process_time()
            for _ in range(repeats):
                fn()
            best = max(best, repeats * x.numel() * 2 / (time.process_time() - cpu) / 1e9)
        rates[label] = round(best, 3)
    return {"compile_s": round(compile_s, 1), "bytes_identical": bool(same),
            "gb_per_cpu_s": rates, "threads": torch.get_num_threads()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="e4m3fnuz", choices=["e4m3fn", "e4m3fnuz"])
    ap.add_argument("--threads", type=int, default=1, help="torch (and inductor OpenMP) threads")
    ap.add_argument("--rows", type=int, default=2048, help="rows of the 4096-wide timed slab")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        torch.set_num_threads(args.threads)
        print(json.dumps(child(args.format, args.rows, args.repeats)))
        return 0
    runs = {}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "PYTHONPATH": str(REPO)}
        for label in ("cold", "warm"):  # the second process finds the first one's compiled code on disk
            out = subprocess.run([sys.executable, __file__, "--child", "--format", args.format, "--threads",
                                  str(args.threads), "--rows", str(args.rows), "--repeats", str(args.repeats)],
                                 env=env, capture_output=True, text=True, check=True)
            runs[label] = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps({"format": args.format, "loadavg": os.getloadavg(), **runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
