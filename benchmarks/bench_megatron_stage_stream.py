"""Peak memory of a Megatron stage's first rank while the weight sync streams the stage, on this machine.

    nice -n 10 python benchmarks/bench_megatron_stage_stream.py [--layers 8] [--layouts TP2,EP2,PP2] [--json out.json]

MEASURED: two gloo trainer ranks (``torch.multiprocessing`` spawn) build a megatron-core GPT/MoE of the tiny
model's shape scaled up (hidden 1024, 8 experts of 1024x1024 SwiGLU, a 32k vocabulary; ``--layers 8`` is ~1.3 GB
of fp32) split TP 2, EP 2 or PP 2, and run ``MegatronTrainer.stage_weights`` through the sync's packer
(``repro.sync.pack_buckets``, buckets dropped as made, as a sent bucket is): what a sync does on the sender
side, minus the network. ``--stack-experts`` adds an ``export_names`` that stacks each layer's experts (the
stream then holds one layer's experts of one projection, and their stacked copy, at a time). Reported per rank:
peak RSS during the stream above the RSS before it (Linux VmHWM, reset first), against a budget of 2 buckets +
twice the largest full tensor (a gather's pieces and the tensor they make; with no ``export_names`` an export
unit is one tensor) and against the stage's full size.

Run it once with ``PYTHONPATH`` at a tree whose ``stage_weights`` is the one to measure: the stage gather it
replaced (pickled ``gather_object`` of every rank's share dict) is measured by pointing PYTHONPATH at a checkout
from before ``repro.train.megatron.stream_weights``; the script only calls the trainer's ``stage_weights``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import tempfile
import time
from pathlib import Path

import torch

LAYOUTS = {"TP2": dict(tensor_model_parallel_size=2), "EP2": dict(expert_model_parallel_size=2),
           "PP2": dict(pipeline_model_parallel_size=2)}


def _peak_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def stack_experts(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An ``export_names`` that stacks each layer's experts of a projection into one [E, ...] tensor, as a
    served layout in transformers' names does (``repro.train.megatron.qwen3.megatron_to_hf``)."""
    out, experts = {}, {}
    for name, tensor in weights.items():
        match = _EXPERT.match(name)
        if match:
            experts.setdefault(f"{match.group(1)}.{match.group(3)}.stacked", {})[int(match.group(2))] = tensor
        else:
            out[name] = tensor
    for name, parts in experts.items():
        out[name] = torch.stack([parts[e] for e in sorted(parts)])
    return out


_EXPERT = re.compile(r"^(decoder\.layers\.\d+\.mlp\.experts)\.local_experts\.(\d+)\.(linear_fc[12])\.weight$")


def _rank(rank: int, port: int, layout: str, layers: int, bucket_mb: int, out: str, stack: bool) -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from repro.sync.stream import pack_buckets
    from repro.train.megatron.parallel import ensure_model_parallel, init_distributed_from_env
    from repro.train.megatron.tiny import TinyGPTMoE, build_tiny_gpt_moe
    from repro.train.megatron.trainer import MegatronTrainer

    init_distributed_from_env()
    sizes = dict(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, expert_model_parallel_size=1,
                 expert_tensor_parallel_size=1, context_parallel_size=1)
    ensure_model_parallel({**sizes, **LAYOUTS[layout]})
    spec = TinyGPTMoE(vocab_size=32768, num_layers=layers, hidden_size=1024, num_attention_heads=8,
                      ffn_hidden_size=4096, num_moe_experts=8, moe_ffn_hidden_size=1024,
                      moe_shared_expert_intermediate_size=1024)
    model = build_tiny_gpt_moe(seed=0, spec=spec)
    # the trainer's export only, without its optimizer state (which would dwarf what is measured here)
    trainer = MegatronTrainer.__new__(MegatronTrainer)
    trainer.model, trainer.dtype, trainer.export_names = model, torch.float32, stack_experts if stack else None
    held = sum(t.numel() * t.element_size() for t in model.state_dict().values() if isinstance(t, torch.Tensor))
    import torch.distributed as dist

    dist.barrier()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM restarts from the current RSS
    base, start = _rss_mb(), time.perf_counter()
    streamed = largest = buckets = 0
    sender = trainer.sync_sender() if hasattr(trainer, "sync_sender") else 0
    for bucket in pack_buckets(trainer.stage_weights(), bucket_mb << 20, version=1, sender=sender or 0):
        streamed += bucket.header.nbytes
        largest = max([largest] + [e.nbytes for e in bucket.header.entries])
        buckets += 1
        bucket = None
    seconds = time.perf_counter() - start
    dist.barrier()
    Path(out, f"rank{rank}.json").write_text(json.dumps(dict(
        rank=rank, leads=streamed > 0, held_bytes=held, streamed_bytes=streamed, largest_tensor=largest,
        buckets=buckets, base_mb=base, peak_mb=_peak_mb(), seconds=seconds)))
    dist.destroy_process_group()


def run_layout(layout: str, layers: int, bucket_mb: int, stack: bool) -> list[dict]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_rank, args=(port, layout, layers, bucket_mb, out, stack), nprocs=2, join=True,
                           start_method="spawn")
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(2)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--bucket-mb", type=int, default=64)
    parser.add_argument("--layouts", default="TP2,EP2,PP2")
    parser.add_argument("--stack-experts", action="store_true",
                        help="export_names stacks each layer's experts (a served layout in transformers' names)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 20))  # freed large buffers go back to the OS
    import repro.train.megatron.trainer as trainer_module

    print(f"MEASURED  stage_weights from {trainer_module.__file__}; {args.layers} layers, fp32, "
          f"{args.bucket_mb} MB buckets{', experts stacked per layer' if args.stack_experts else ''}; "
          f"load average {os.getloadavg()}")
    print(f"{'layout':<6} {'rank':>4} {'leads':>5} {'stage GB':>8} {'sent GB':>8} {'largest MB':>10} "
          f"{'peak-base MB':>12} {'budget MB':>9} {'within':>6} {'x stage':>7} {'s':>6}")
    report = {}
    for layout in args.layouts.split(","):
        rows = run_layout(layout, args.layers, args.bucket_mb, args.stack_experts)
        report[layout] = rows
        budget = (2 * (args.bucket_mb << 20) + 2 * max(r["largest_tensor"] for r in rows)) / 2**20
        for r in rows:
            used = r["peak_mb"] - r["base_mb"]
            r.update(used_mb=used, budget_mb=budget)
            stage = r["streamed_bytes"] or r["held_bytes"]
            print(f"{layout:<6} {r['rank']:>4} {str(r['leads']):>5} {stage / 1e9:8.2f} "
                  f"{r['streamed_bytes'] / 1e9:8.2f} {r['largest_tensor'] / 2**20:10.1f} {used:12.0f} {budget:9.0f} "
                  f"{'yes' if used <= budget else 'NO':>6} {used * 2**20 / stage:7.2f} {r['seconds']:6.1f}")
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
