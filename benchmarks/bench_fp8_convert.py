"""Benchmark (not a test): FP8 conversion throughput against `cp` of the same files.

    .venv/bin/python benchmarks/bench_fp8_convert.py                 # ~2.4 GB synthetic checkpoint in /tmp
    .venv/bin/python benchmarks/bench_fp8_convert.py --size-gb 4 --workers 8

Builds a synthetic multi-shard BF16 checkpoint with DeepSeek-V4-Flash tensor shapes (hidden 4096, 64 heads
of 512, q/o LoRA 1024, 8 output groups, 256-wide indexer, routed experts 2048×4096; vocabulary cut to 4096
so the kept-in-BF16 share stays near the real model's ~1%), then in the same run times:
  - `cp -r` of the shards (page cache to page cache): the I/O ceiling, and `cp` + `sync` (data on disk);
  - `python -m repro convert` with --no-fsync (compare with cp) and with fsync (compare with cp + sync); the
    converter writes with O_DIRECT where the file system allows it, so even without fsync its output is on
    the device when it ends, while cp's is still in the page cache;
  - the in-memory quantiser alone on one process and thread (no I/O), with and without the error pass.
Conversion GB/s counts BF16 input bytes per second of the converter's own clock (process start-up, ~1-2 s
of importing torch, is reported separately). Peak RSS is the largest resident set of the converter's main
process and its workers (getrusage, cross-checked by sampling the process tree with psutil), next to the RSS
of a python that has only imported torch. CPU seconds of every process are counted too (GB per CPU-second
is robust to other load on a shared machine, wall-clock GB/s is not). All inputs are read once before each
timed run so every run reads from the page cache; runs are interleaved and repeated, and the best of each
kind is reported (the load average is recorded: on a shared machine the spread is large).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

HIDDEN, HEADS, HEAD_DIM, Q_LORA, O_GROUPS, O_LORA = 4096, 64, 512, 1024, 8, 1024
IDX_HEADS, IDX_DIM, EXPERT_I, VOCAB = 64, 128, 2048, 4096


def layer_tensors(i: int, experts: int) -> list[tuple[str, tuple[int, ...]]]:
    p = f"layers.{i}"
    shapes = [
        (f"{p}.attn_norm.weight", (HIDDEN,)),
        (f"{p}.attn.wq_a.weight", (Q_LORA, HIDDEN)),
        (f"{p}.attn.q_norm.weight", (Q_LORA,)),
        (f"{p}.attn.wq_b.weight", (HEADS * HEAD_DIM, Q_LORA)),
        (f"{p}.attn.wkv.weight", (HEAD_DIM, HIDDEN)),
        (f"{p}.attn.kv_norm.weight", (HEAD_DIM,)),
        (f"{p}.attn.wo_a.weight", (O_GROUPS * O_LORA, HEADS * HEAD_DIM // O_GROUPS)),
        (f"{p}.attn.wo_b.weight", (HIDDEN, O_GROUPS * O_LORA)),
        (f"{p}.attn.attn_sink", (HEADS,)),
        (f"{p}.attn.compressor.wkv.weight", (2 * HEAD_DIM, HIDDEN)),
        (f"{p}.attn.compressor.wgate.weight", (2 * HEAD_DIM, HIDDEN)),
        (f"{p}.attn.compressor.ape", (4, 2 * HEAD_DIM)),
        (f"{p}.attn.compressor.norm.weight", (HEAD_DIM,)),
        (f"{p}.attn.indexer.wq_b.weight", (IDX_HEADS * IDX_DIM, Q_LORA)),
        (f"{p}.attn.indexer.weights_proj.weight", (IDX_HEADS, HIDDEN)),
        (f"{p}.attn.indexer.compressor.wkv.weight", (2 * IDX_DIM, HIDDEN)),
        (f"{p}.attn.indexer.compressor.wgate.weight", (2 * IDX_DIM, HIDDEN)),
        (f"{p}.attn.indexer.compressor.ape", (4, 2 * IDX_DIM)),
        (f"{p}.hc_attn_fn", (24, 4 * HIDDEN)),
        (f"{p}.hc_attn_base", (24,)),
        (f"{p}.hc_attn_scale", (3,)),
        (f"{p}.ffn_norm.weight", (HIDDEN,)),
        (f"{p}.ffn.gate.weight", (256, HIDDEN)),
        (f"{p}.ffn.gate.bias", (256,)),
        (f"{p}.ffn.shared_experts.w1.weight", (EXPERT_I, HIDDEN)),
        (f"{p}.ffn.shared_experts.w2.weight", (HIDDEN, EXPERT_I)),
        (f"{p}.ffn.shared_experts.w3.weight", (EXPERT_I, HIDDEN)),
    ]
    for e in range(experts):
        shapes += [(f"{p}.ffn.experts.{e}.w1.weight", (EXPERT_I, HIDDEN)),
                   (f"{p}.ffn.experts.{e}.w2.weight", (HIDDEN, EXPERT_I)),
                   (f"{p}.ffn.experts.{e}.w3.weight", (EXPERT_I, HIDDEN))]
    return shapes


def build(src: Path, size_gb: float, shard_gb: float, layers: int) -> dict:
    from safetensors.torch import save_file

    per_layer_fixed = sum(math.prod(s) * 2 for _, s in layer_tensors(0, 0))
    per_expert = 3 * EXPERT_I * HIDDEN * 2
    embed = 2 * VOCAB * HIDDEN * 2
    experts = max(1, math.ceil((size_gb * 1e9 - embed - layers * per_layer_fixed) / (layers * per_expert)))
    names = [("embed.weight", (VOCAB, HIDDEN))]
    for i in range(layers):
        names += layer_tensors(i, experts)
    names += [("norm.weight", (HIDDEN,)), ("head.weight", (VOCAB, HIDDEN))]
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    shards, current, size = [], {}, 0
    for name, shape in names:
        t = torch.randn(shape, generator=g).mul_(0.02).to(torch.bfloat16)
        if name.endswith(("norm.weight", "hc_attn_scale")):
            t = torch.ones(shape, dtype=torch.bfloat16)
        current[name] = t
        size += t.numel() * 2
        if size >= shard_gb * 1e9:
            shards.append(current)
            current, size = {}, 0
    if current:
        shards.append(current)
    weight_map = {}
    for k, tensors in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, src / fname, metadata={"format": "pt"})
        weight_map.update({n: fname for n in tensors})
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    # the release's config keys (as DeepSeek-V4-Flash ships them), so the converter copies the config as is
    from transformers import DeepseekV4Config

    from repro.model.release_config import release_config

    config = release_config(DeepseekV4Config(num_hidden_layers=layers, hidden_size=HIDDEN, vocab_size=VOCAB))
    (src / "config.json").write_text(json.dumps(config))
    files = sorted(src.glob("*.safetensors"))
    return {"layers": layers, "experts_per_layer": experts, "tensors": len(names), "shards": len(files),
            "bytes": sum(f.stat().st_size for f in files), "largest_shard_bytes": max(f.stat().st_size for f in files),
            "largest_tensor_bytes": max(math.prod(s) * 2 for _, s in names)}


def describe(src: Path) -> dict:
    from repro.fp8.safetensors_io import read_header

    files = sorted(src.glob("*.safetensors"))
    infos = [t for f in files for t in read_header(f)[0]]
    return {"layers": None, "experts_per_layer": None, "tensors": len(infos), "shards": len(files),
            "bytes": sum(f.stat().st_size for f in files), "largest_shard_bytes": max(f.stat().st_size for f in files),
            "largest_tensor_bytes": max(t.nbytes for t in infos)}


def sh(cmd: str) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, shell=True, check=True)
    return time.perf_counter() - start


def warm(src: Path) -> None:
    sh(f"cat {src}/*.safetensors > /dev/null")


def time_cp(src: Path, dst: Path, with_sync: bool) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of `cp -r` (+ `sync`)."""
    shutil.rmtree(dst, ignore_errors=True)
    sh("sync")
    warm(src)
    cpu, start = children_cpu_seconds(), time.perf_counter()
    subprocess.run(["cp", "-r", str(src), str(dst)], check=True)
    if with_sync:
        subprocess.run(["sync"], check=True)
    return time.perf_counter() - start, children_cpu_seconds() - cpu


def time_convert(src: Path, dst: Path, workers: int, threads: int, fmt: str, fsync: bool) -> dict:
    """One `repro convert` run; its RSS (main process + workers) is also sampled every 20 ms with psutil."""
    import psutil

    shutil.rmtree(dst, ignore_errors=True)
    sh("sync")
    warm(src)
    cmd = [sys.executable, "-m", "repro", "convert", "--input", str(src), "--output", str(dst), "--format", fmt,
           "--workers", str(workers), "--threads", str(threads), "--json"] + ([] if fsync else ["--no-fsync"])
    cpu, start = children_cpu_seconds(), time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    parent, sampled = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        try:
            tree = [parent] + parent.children(recursive=True)
            sampled = max([sampled] + [p.memory_info().rss for p in tree if p.is_running()])
        except psutil.Error:
            pass
        time.sleep(0.02)
    stdout, stderr = proc.communicate()
    wall, cpu = time.perf_counter() - start, children_cpu_seconds() - cpu
    if proc.returncode:
        raise SystemExit(f"convert failed: {stderr}")
    out = json.loads(stdout.strip().splitlines()[-1])
    return {**out, "wall_seconds": wall, "cpu_seconds": cpu, "sampled_peak_rss_mib": sampled / 2**20}


def baseline_rss_mib() -> float:
    """Peak RSS of a python that has imported torch and repro.fp8 and done nothing else."""
    code = "from repro.fp8.convert import current_peak_rss; print(current_peak_rss())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    return int(out.stdout) / 2**20


def children_cpu_seconds() -> float:
    """User + system CPU time of all waited-for child processes so far (their own children included)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def quantiser_alone(fmt: str) -> dict:
    """One process, one thread, no I/O: the compute ceiling per core."""
    from repro.fp8.quant import quantize_block, quantize_block_with_error

    torch.set_num_threads(1)
    w = (torch.randn(EXPERT_I, HIDDEN) * 0.02).bfloat16()
    res = {}
    for label, fn in (("quantise_gb_per_s_1core", quantize_block),
                      ("quantise_and_check_gb_per_s_1core", quantize_block_with_error)):
        fn(w, fmt)
        start = time.perf_counter()
        for _ in range(10):
            fn(w, fmt)
        res[label] = round(10 * w.numel() * 2 / (time.perf_counter() - start) / 1e9, 3)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/repro-fp8-bench", help="scratch folder (needs ~2.5x --size-gb free)")
    ap.add_argument("--size-gb", type=float, default=2.4)
    ap.add_argument("--shard-gb", type=float, default=0.5)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--workers", type=int, default=1, help="converter processes (shards in parallel)")
    ap.add_argument("--threads", type=int, default=0, help="threads per worker (0: the cores / workers)")
    ap.add_argument("--format", default="e4m3fnuz", choices=["e4m3fn", "e4m3fnuz"])
    ap.add_argument("--repeats", type=int, default=2, help="interleaved repetitions; the best of each is reported")
    ap.add_argument("--out", default=str(REPO / "runs" / "bench_fp8_convert.json"))
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    ap.add_argument("--reuse-input", action="store_true", help="reuse a synthetic checkpoint kept by --keep")
    args = ap.parse_args()

    base = Path(args.dir)
    src, cp_dst, fp8_dst = base / "bf16", base / "cp", base / "fp8"
    print(f"building ~{args.size_gb} GB synthetic DSV4-shaped checkpoint in {src} ...", flush=True)
    t = time.perf_counter()
    info = describe(src) if args.reuse_input and (src / "config.json").exists() else build(
        src, args.size_gb, args.shard_gb, args.layers)
    print(f"  {info['bytes'] / 1e9:.2f} GB, {info['shards']} shards, {info['tensors']} tensors "
          f"({time.perf_counter() - t:.0f} s)")
    gb = info["bytes"] / 1e9
    load_before = os.getloadavg()
    runs: dict[str, list] = {"cp": [], "convert": [], "cp_sync": [], "convert_fsync": []}
    for _ in range(args.repeats):  # interleaved, best of N: the machine may be shared
        runs["cp"].append(time_cp(src, cp_dst, with_sync=False))
        runs["convert"].append(time_convert(src, fp8_dst, args.workers, args.threads, args.format, fsync=False))
        runs["cp_sync"].append(time_cp(src, cp_dst, with_sync=True))
        runs["convert_fsync"].append(time_convert(src, fp8_dst, args.workers, args.threads, args.format, fsync=True))
    shutil.rmtree(cp_dst, ignore_errors=True)
    alone = quantiser_alone(args.format)
    cp_best = gb / min(w for w, _ in runs["cp"])
    cp_sync_best = gb / min(w for w, _ in runs["cp_sync"])
    conv = max(runs["convert"], key=lambda r: r["input_gb_per_s"])
    conv_sync = max(runs["convert_fsync"], key=lambda r: r["input_gb_per_s"])
    every_conv = runs["convert"] + runs["convert_fsync"]
    result = {
        "checkpoint": info, "format": args.format, "workers": args.workers, "threads": args.threads,
        "cpu_count": os.cpu_count(),
        "repeats": args.repeats, "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "cp_gb_per_s": round(cp_best, 3),
        "convert_gb_per_s": conv["input_gb_per_s"],
        "ratio_to_cp": round(conv["input_gb_per_s"] / cp_best, 3),
        "cp_sync_gb_per_s": round(cp_sync_best, 3),
        "convert_fsync_gb_per_s": conv_sync["input_gb_per_s"],
        "ratio_fsync_to_cp_sync": round(conv_sync["input_gb_per_s"] / cp_sync_best, 3),
        "all_runs_gb_per_s": {"cp": [round(gb / w, 3) for w, _ in runs["cp"]],
                              "convert": [r["input_gb_per_s"] for r in runs["convert"]],
                              "cp_sync": [round(gb / w, 3) for w, _ in runs["cp_sync"]],
                              "convert_fsync": [r["input_gb_per_s"] for r in runs["convert_fsync"]]},
        # CPU time is robust to other load on the machine: GB converted per CPU-second, all processes counted
        "cp_gb_per_cpu_s": round(gb / min(c for _, c in runs["cp"]), 3),
        "convert_gb_per_cpu_s": round(gb / min(r["cpu_seconds"] for r in runs["convert"]), 3),
        # first shard started -> last finished: excludes the ~2 s per worker of spawning and importing torch,
        # which a 2.5 GB run feels and a 568 GB conversion does not
        "convert_steady_gb_per_s": max(r["steady_input_gb_per_s"] for r in runs["convert"]),
        "convert_wall_seconds_incl_startup": round(conv["wall_seconds"], 2),
        "peak_rss_mib": max(r["peak_rss_mib"] for r in every_conv),
        "peak_rss_main_mib": max(r["peak_rss_main_mib"] for r in every_conv),
        "sampled_peak_rss_mib": round(max(r["sampled_peak_rss_mib"] for r in every_conv), 1),
        "baseline_rss_mib_torch_imported": round(baseline_rss_mib(), 1),
        "largest_shard_mib": round(info["largest_shard_bytes"] / 2**20, 1),
        "largest_tensor_mib": round(info["largest_tensor_bytes"] / 2**20, 1),
        "rel_error_max": conv["rel_error_max"], "size_ratio": conv["size_ratio"],
        **alone,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    print("\n| input | workers x threads | load avg | cp | convert (steady) | ratio | cp+sync | convert+fsync | ratio "
          "| GB/CPU-s cp / convert | peak RSS (torch alone) | largest shard / tensor |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(f"| {gb:.2f} GB, {info['shards']} shards | {args.workers} x {args.threads or 'auto'} threads, "
          f"{os.cpu_count()} cores "
          f"| {load_before[0]:.1f} | {result['cp_gb_per_s']} GB/s "
          f"| {result['convert_gb_per_s']} ({result['convert_steady_gb_per_s']}) GB/s | {result['ratio_to_cp']} "
          f"| {result['cp_sync_gb_per_s']} GB/s | {result['convert_fsync_gb_per_s']} GB/s "
          f"| {result['ratio_fsync_to_cp_sync']} | {result['cp_gb_per_cpu_s']} / {result['convert_gb_per_cpu_s']} "
          f"| {result['peak_rss_mib']:.0f} MiB ({result['baseline_rss_mib_torch_imported']:.0f}) "
          f"| {result['largest_shard_mib']:.0f} / {result['largest_tensor_mib']:.0f} MiB |")
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
