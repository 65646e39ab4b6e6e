"""Streaming weight sync, measured on this machine, and extrapolated (labelled ESTIMATE) to AMD's cluster.

    nice -n 10 python benchmarks/bench_weight_sync.py [--layers 30] [--bucket-mb 256] [--json out.json]

MEASURED: a synthetic DeepSeek-V4-shaped checkpoint (release tensor names and dtypes, the tiny model's layer
with every dimension >= 32 scaled by 8: hidden 1024, 8 experts of 1024x1024 per layer, a 32768-token vocab;
``--layers 30`` makes 2.2 GB of BF16, FP32 where the release keeps FP32) is written as safetensors under /tmp
and deleted after. Two trainer processes and two rollout processes run repro's sync (``repro.sync``,
``repro.sync.group``, gloo over loopback), twice per layout:

* PP2: each trainer rank holds one pipeline stage (half the layers; embed on the first, head on the last)
  and streams its own layers on its own sync group; each receiver takes stage 0's stream, then stage 1's.
* TP2: each trainer rank holds half the rows of every matrix (vectors whole on both); per tensor, rank 1's
  half is sent to rank 0 over the trainers' own gloo world (``init_process_group``), received straight into
  the full tensor's second half, and rank 0 sends.

Each receiver writes every bucket into its preallocated model copy, then checks it against the checkpoint bit
for bit. Reported per process: peak RSS during the two syncs (the peak is reset after loading, so reading the
checkpoint does not count) above its RSS before it loaded any weights, against the budget
"its model copy + 2 buckets + the largest tensor"; and GB/s at the receivers (10^9 bytes of tensors per second
over the whole sync: transport, checksum, unpacking, copying in). Also measured on one core: CRC-32 (the
check the sync used before), ``repro.sync.payload_checksum`` (the one it uses now) and block-FP8
re-quantisation (``repro.fp8.quant``).

ESTIMATE: ``extrapolate`` turns those into seconds per step for DeepSeek-V4-Flash's 568 GB of BF16 over 400 Gb/s
RoCE, and ``sync_costs`` (both in ``benchmarks/sync_estimate.py``) adds what each way of syncing costs beside
the wire -- host<->GPU crossings and checksums -- for ours before (host copies, CRC-32), ours after
(device-resident, on-device checksum) and vLLM's engine; the assumptions are printed with the tables.

    python benchmarks/bench_weight_sync.py --estimate-only     (seconds: the throughputs and the estimate)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue as queue_module
import resource
import shutil
import tempfile
import time
import zlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the estimate beside it, when loaded by path
from sync_estimate import DEVICE_CHECKSUM_GBPS, PCIE_GBPS, PUBLISHED, extrapolate, print_costs  # noqa: E402

SCALE, VOCAB, BF16 = 8, 32768, torch.bfloat16


# ---- the synthetic checkpoint -------------------------------------------------------------------------------

def synthetic_spec(layers: int) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """(release name, shape, dtype) in release order: the tiny DeepSeek-V4's layer 1 repeated, dims scaled."""
    from repro.model import layouts
    from repro.model.tiny import build_tiny_model
    from repro.model.tiny_release import stored_dtype

    tiny = layouts.to_release(build_tiny_model(seed=0).state_dict())

    def scaled(shape):
        return tuple(VOCAB if d == 25 else d * SCALE if d >= 32 else d for d in shape)

    template = [(n.removeprefix("layers.1."), t) for n, t in tiny.items() if n.startswith("layers.1.")]
    spec = [("embed.weight", scaled(tiny["embed.weight"].shape), BF16)]
    for layer in range(layers):
        for suffix, t in template:
            name = f"layers.{layer}.{suffix}"
            spec.append((name, scaled(t.shape), stored_dtype(name, t, BF16)))
    spec += [(n, scaled(t.shape), stored_dtype(n, t, BF16)) for n, t in tiny.items()
             if not n.startswith(("layers.", "embed.", "mtp."))]
    return spec


def shard_key(name: str) -> str:
    return name.split(".")[1] if name.startswith("layers.") else "embed" if name.startswith("embed.") else "rest"


def write_checkpoint(folder: Path, spec) -> None:
    """One safetensors file per layer (and one for the rest); seeded random values."""
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(0)
    shards: dict[str, dict[str, torch.Tensor]] = {}
    for name, shape, dtype in spec:
        key = shard_key(name)
        shards.setdefault(key, {})[name] = torch.randn(shape, generator=generator).to(dtype)
        if len(shards) > 1:  # a layer is complete: write it, keep memory to one layer
            done = next(iter(shards))
            save_file(shards.pop(done), str(folder / f"part-{done}.safetensors"))
    for key, tensors in shards.items():
        save_file(tensors, str(folder / f"part-{key}.safetensors"))


def read_tensor(folder: Path, name: str) -> torch.Tensor:
    from safetensors import safe_open

    with safe_open(str(folder / f"part-{shard_key(name)}.safetensors"), "pt") as f:
        return f.get_tensor(name)


def nbytes(shape, dtype) -> int:
    return torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()


# ---- the four processes ---------------------------------------------------------------------------------------

def rss_mb() -> float:
    """Peak RSS (VmHWM) since the last ``reset_peak``."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024  # KiB


def reset_peak() -> None:
    """Start the peak over from the current RSS (Linux >= 4.0), so loading the weights does not count."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def pp_stage(spec, stage: int, layers: int) -> list[str]:
    half = layers // 2
    out = []
    for name, _, _ in spec:
        layer = int(name.split(".")[1]) if name.startswith("layers.") else (-1 if name.startswith("embed") else layers)
        if (layer < half) == (stage == 0):
            out.append(name)
    return out


def trainer_process(role: dict, queue) -> None:
    import torch.distributed as dist

    from repro.sync.stream import pack_buckets
    from repro.sync.group import SyncAddress, SyncGroup

    torch.set_num_threads(1)
    folder, spec, rank = Path(role["folder"]), role["spec"], role["rank"]
    if role["layout"] == "TP2":
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{role['trainer_port']}", rank=rank, world_size=2)
    sends = role["layout"] == "PP2" or rank == 0
    group = SyncGroup(SyncAddress(**role["address"]), 0) if sends else None
    base = current_rss_mb()
    if role["layout"] == "PP2":
        held = {n: read_tensor(folder, n) for n in pp_stage(spec, rank, role["layers"])}
    else:
        held = {}
        for name, shape, _ in spec:
            full = read_tensor(folder, name)
            held[name] = full.chunk(2)[rank].clone() if len(shape) >= 2 else full

    def full_tensors():  # TP2: per tensor, the row halves gathered to rank 0 (collective: both ranks iterate)
        for name, shape, _ in spec:
            part = held[name]
            if len(shape) < 2:
                yield name, part
                continue
            if rank == 1:
                dist.send(part, dst=0)
                continue
            full = torch.empty(shape, dtype=part.dtype)  # rank 1's half lands in place: no gather buffer
            mine, theirs = full.chunk(2)
            mine.copy_(part)
            dist.recv(theirs, src=1)
            yield name, full
            full = mine = theirs = None

    seconds = []
    reset_peak()
    for version in (1, 2):
        start = time.perf_counter()
        named = held.items() if role["layout"] == "PP2" else full_tensors()
        if group is not None:
            group.send(pack_buckets(named, role["bucket_bytes"], version, role["sender"]))
        else:
            for _ in named:
                pass
        seconds.append(time.perf_counter() - start)
    model = sum(t.numel() * t.element_size() for t in held.values())
    largest = max(nbytes(s, d) for _, s, d in spec)
    queue.put({"process": f"{role['layout']} trainer rank {rank}", "model_bytes": model, "peak_mb": rss_mb(),
               "base_mb": base, "buckets": 2 if sends else 0, "largest": largest, "seconds": seconds})
    if role["layout"] == "TP2":
        dist.destroy_process_group()


def receiver_process(role: dict, queue) -> None:
    from repro.sync.stream import verified_stream
    from repro.sync.group import receive_all, SyncAddress, SyncGroup

    torch.set_num_threads(1)
    spec = role["spec"]
    groups = [SyncGroup(SyncAddress(**a), role["rank"]) for a in role["addresses"]]
    base = current_rss_mb()
    model = {name: torch.zeros(shape, dtype=dtype) for name, shape, dtype in spec}  # the engine's copy, resident
    seconds, received = [], 0
    reset_peak()
    for version in (1, 2):
        start, received = time.perf_counter(), 0
        for _, named in verified_stream(receive_all(groups, version), version, len(groups)):
            for name, tensor in named:
                model[name].copy_(tensor)
                received += tensor.numel() * tensor.element_size()
        seconds.append(time.perf_counter() - start)
    peak = rss_mb()
    wrong = [n for n, _, _ in spec
             if not torch.equal(model[n].view(torch.uint8), read_tensor(Path(role["folder"]), n).view(torch.uint8))]
    queue.put({"process": f"{role['layout']} receiver {role['rank'] - 1}", "model_bytes": sum(
        t.numel() * t.element_size() for t in model.values()), "peak_mb": peak, "base_mb": base, "buckets": 2,
        "largest": max(nbytes(s, d) for _, s, d in spec), "seconds": seconds, "received": received,
        "bit_identical": not wrong, "wrong": wrong[:3]})


def run_layout(layout: str, folder: Path, spec, layers: int, bucket_bytes: int) -> list[dict]:
    from repro.sync.group import free_address

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    senders = 2 if layout == "PP2" else 1
    addresses = [dict(host="127.0.0.1", port=free_address("127.0.0.1")[1], sender=s, receivers=2, timeout_s=600)
                 for s in range(senders)]
    common = dict(folder=str(folder), spec=spec, layout=layout, layers=layers, bucket_bytes=bucket_bytes)
    trainer_port = free_address("127.0.0.1")[1]
    procs = [ctx.Process(target=trainer_process, args=(dict(common, rank=r, sender=r if layout == "PP2" else 0,
                                                            address=addresses[min(r, senders - 1)],
                                                            trainer_port=trainer_port), queue)) for r in range(2)]
    procs += [ctx.Process(target=receiver_process, args=(dict(common, rank=1 + r, addresses=addresses), queue))
              for r in range(2)]
    for p in procs:
        p.start()
    results = []
    while len(results) < len(procs):
        try:
            results.append(queue.get(timeout=5))
        except queue_module.Empty:
            failed = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if failed:
                for p in procs:
                    p.kill()
                raise RuntimeError(f"{layout}: benchmark process(es) {failed} failed (their traceback is above)")
    for p in procs:
        p.join(60)
    return sorted(results, key=lambda r: r["process"])


# ---- single-core throughputs ----------------------------------------------------------------------------------

def _best_gbps(check, data: torch.Tensor, tries: int = 3) -> float:
    """GB/s of the fastest of ``tries`` runs (the cores here are shared: the slower runs measure the neighbours)."""
    check(data[: 1 << 20])  # first-call set-up out of the timing
    best = float("inf")
    for _ in range(tries):
        start = time.perf_counter()
        check(data)
        best = min(best, time.perf_counter() - start)
    return data.numel() / best / 1e9


def crc32_gbps(megabytes: int = 256) -> float:
    """zlib's CRC-32, what repro.sync checked each bucket with before (on the host, one core)."""
    data = torch.randint(0, 256, (megabytes << 20,), dtype=torch.uint8)
    return _best_gbps(lambda d: zlib.crc32(d.numpy()), data)


def checksum_gbps(megabytes: int = 256) -> float:
    """repro.sync.payload_checksum (int64 words mod 2^64, a torch reduction) on one CPU thread."""
    from repro.sync.stream import payload_checksum

    data = torch.randint(0, 256, (megabytes << 20,), dtype=torch.uint8)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _best_gbps(payload_checksum, data)
    finally:
        torch.set_num_threads(threads)


def fp8_seconds_per_gb() -> float:
    from repro.fp8.quant import quantize_block

    weight = torch.randn(4096, 4096).to(BF16)
    start = time.perf_counter()
    quantize_block(weight, "e4m3fn", block_size=128)
    return (time.perf_counter() - start) / (weight.numel() * 2 / 1e9)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=30, help="synthetic layers (30: 2.2 GB)")
    parser.add_argument("--bucket-mb", type=int, default=256)
    parser.add_argument("--layouts", default="PP2,TP2")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--glibc-malloc-default", action="store_true",
                        help="leave glibc's dynamic mmap threshold on (freed 32 MB buffers then stay in the heap)")
    parser.add_argument("--estimate-only", action="store_true", help="skip the four-process run")
    args = parser.parse_args(argv)
    if not args.glibc_malloc_default:  # inherited by the spawned processes: large buffers go back to the OS on free
        os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 20))
    spec = synthetic_spec(args.layers)
    total = sum(nbytes(s, d) for _, s, d in spec)
    folder = Path(tempfile.mkdtemp(prefix="repro-bench-sync-", dir="/tmp"))
    report = {"checkpoint_gb": total / 1e9, "tensors": len(spec), "bucket_mb": args.bucket_mb, "layouts": {}}
    try:
        if not args.estimate_only:
            write_checkpoint(folder, spec)
            print(f"MEASURED  synthetic DeepSeek-V4 checkpoint: {len(spec)} tensors, {total / 1e9:.2f} GB, "
                  f"buckets of {args.bucket_mb} MB, gloo over loopback")
        for layout in [] if args.estimate_only else args.layouts.split(","):
            rows = run_layout(layout, folder, spec, args.layers, args.bucket_mb << 20)
            report["layouts"][layout] = rows
            print(f"\n{layout}: {'process':<24} {'model GB':>8} {'budget GB':>9} {'peak-base GB':>12} {'within':>6}")
            for r in rows:
                budget = r["model_bytes"] + r["buckets"] * (args.bucket_mb << 20) + r["largest"]
                used = (r["peak_mb"] - r["base_mb"]) * 2**20
                r.update(budget_bytes=budget, used_bytes=used)
                print(f"     {r['process']:<24} {r['model_bytes'] / 1e9:8.2f} {budget / 1e9:9.2f} {used / 1e9:12.2f} "
                      f"{'yes' if used <= budget else 'NO':>6}  ({used / budget:.0%} of budget)")
            for r in rows:
                if "received" in r:
                    print(f"     {r['process']}: sync 1 {r['received'] / r['seconds'][0] / 1e9:.2f} GB/s, "
                          f"sync 2 {r['received'] / r['seconds'][1] / 1e9:.2f} GB/s; "
                          f"bit-identical: {r['bit_identical']}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    crc, ours, fp8 = crc32_gbps(), checksum_gbps(), fp8_seconds_per_gb()
    report.update(crc32_gbps=crc, checksum_gbps=ours, fp8_s_per_gb=fp8)
    print(f"\nMEASURED  on one CPU core: CRC-32 {crc:.2f} GB/s (the old check), repro.sync.payload_checksum "
          f"{ours:.2f} GB/s (the new one); block-FP8 quantisation {fp8:.2f} s per GB of BF16 (repro.fp8.quant)")
    estimate = extrapolate(fp8_s_per_gb=report["fp8_s_per_gb"], crc_gbps=crc)
    report["estimate"] = estimate
    print("\nESTIMATE  568 GB BF16 per step over 400 Gb/s RoCE; assumptions: a sender moves 80% of one NIC's line "
          "rate, or what verl measured per sender; AMD's actor is PP4; the rollout node has 8 NICs and 8 GPUs; the "
          "FP8 column is 568 GB at THIS CPU's measured rate spread over 8 workers -- GPU kernels are far faster and "
          "are not measured here")
    for row in estimate:
        print(f"  {row['scheme']:<36} {row['per sender']:<26} {row['GB/s']:6.1f} GB/s  transfer "
              f"{row['transfer_s']:6.1f} s  FP8 at CPU rate {row['fp8_s']:5.0f} s")
    print(f"\nESTIMATE  what each way of syncing adds (seconds per step); assumptions: host<->GPU copies at "
          f"{PCIE_GBPS:g} GB/s per GPU (pageable memory; PCIe Gen5 x16 peaks at 64), CRC-32 at this CPU's measured "
          f"{crc:.2f} GB/s on one core per process, the on-device checksum at {DEVICE_CHECKSUM_GBPS:g} GB/s (one "
          "HBM read; NOT measured: no GPU here); per byte: ours before 4 crossings (sender 2, each receiver 2) + "
          "CRC-32 on sender and receiver, ours after 0 crossings + 2 on-device checksums, vLLM's engine neither "
          "(one source rank only); ours runs these in turn per bucket, so they add to the transfer, and takes the "
          "stages' streams in turn, so its per-stage transfer is one sender's")
    print_costs(estimate)
    print("PUBLISHED")
    for who, what in PUBLISHED:
        print(f"  {who}: {what}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
