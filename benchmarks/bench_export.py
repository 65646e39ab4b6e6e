"""Time and memory of `repro export` against the size of the checkpoint, on this machine.

    nice -n 10 python benchmarks/bench_export.py [--layers 2,8] [--hidden 1024] [--layout deepseek] [--json out.json]
    python benchmarks/bench_export.py --run-dir runs/tiny-cpu          # a real run's newest checkpoint instead

MEASURED: for each layer count a run directory is made with the tiny DeepSeek-V4 widened to ``--hidden`` (8 experts of
hidden x hidden SwiGLU, 4 layers of the tiny model's attention kinds repeated), saved by the embedded bf16 trainer's
own ``save`` (model.safetensors in BF16, master.safetensors in FP32) in a child process, so the measuring process
never held the model. The measuring process imports everything ``export_run`` imports, records its RSS, resets its
peak (``/proc/self/clear_refs``), exports, and reports the peak RSS above that start (Linux VmHWM) beside the
masters' size: a streamed export's extra memory is its slab (``SLAB_BYTES`` of source and its cast copy) and the
writer's staging buffers, whatever the model's size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _status(key: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) / 1024


def build_run(run_dir: Path, layers: int, hidden: int) -> None:
    """A run directory whose one checkpoint holds a widened tiny DeepSeek-V4 (in this process: call it in a child)."""
    import torch

    from repro.model.tiny import build_tiny_model
    from repro.recipes import load_recipe
    from repro.run.checkpoints import save_checkpoint
    from repro.run.run_dir import prepare_run_dir
    from repro.train.embedded import EmbeddedTrainer
    from repro.train.grpo_update import TrainerSettings

    kinds = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
             "compressed_sparse_attention"]
    model = build_tiny_model(0, hidden_size=hidden, moe_intermediate_size=hidden, num_hidden_layers=layers,
                             layer_types=[kinds[i % 4] for i in range(layers)],
                             mlp_layer_types=["hash_moe"] + ["moe"] * (layers - 1))
    recipe = load_recipe("tiny-cpu", ["steps=1"])
    prepare_run_dir(recipe, run_dir, resume=False)
    (run_dir / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1, "reward/accuracy": 0.5}) + "\n")
    trainer = EmbeddedTrainer(model, TrainerSettings(dtype="bf16", max_tokens_per_micro_batch=16384, temperature=1.0))
    torch.manual_seed(0)
    save_checkpoint(run_dir / "checkpoints", 1, trainer, {}, run_dir / "metrics.jsonl", keep_last=1)


def measure(run_dir: Path, out: Path, layout: str) -> dict:
    """Export in this process; peak RSS above the RSS just before (everything already imported)."""
    import transformers  # noqa: F401  (export_run imports these lazily: import them before the baseline)
    from transformers import AutoConfig, DeepseekV4Config  # noqa: F401

    import repro.analysis.model_card  # noqa: F401
    import repro.model.streamed_export  # noqa: F401
    from repro.run.export import export_run

    start = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    began = time.perf_counter()
    result = export_run(run_dir, out, layout=layout)
    seconds = time.perf_counter() - began
    masters = sum(p.stat().st_size for p in (run_dir / "checkpoints").glob("step_*/trainer/master.safetensors"))
    if not masters:
        masters = sum(p.stat().st_size for p in (run_dir / "checkpoints").glob("step_*/trainer/model.safetensors"))
    return {"masters_mb": round(masters / 2**20, 1), "written_mb": round(result.bytes / 2**20, 1),
            "tensors": result.tensors, "seconds": round(seconds, 2), "rss_start_mb": round(start, 1),
            "peak_above_start_mb": round(_status("VmHWM") - start, 1)}


def _child(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise SystemExit(done.stderr)
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="2,8",
                        help="comma-separated layer counts of the widened model (2 at least: layer 0 is hash-routed)")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layout", default="deepseek", choices=("deepseek", "hf"))
    parser.add_argument("--run-dir", type=Path, default=None, help="measure this run's newest checkpoint instead")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--_build", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--_measure", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._build:
        build_run(Path(args._build[0]), int(args._build[1]), int(args._build[2]))
        return
    if args._measure:
        print(json.dumps(measure(Path(args._measure[0]), Path(args._measure[1]), args._measure[2])))
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
        cases = [("run", args.run_dir)] if args.run_dir else []
        for layers in ([] if args.run_dir else [int(n) for n in args.layers.split(",")]):
            run_dir = Path(tmp) / f"run-{layers}"
            _child("--_build", str(run_dir), str(layers), str(args.hidden))
            cases.append((f"{layers} layers, hidden {args.hidden}", run_dir))
        for name, run_dir in cases:
            row = {"case": name, **json.loads(_child("--_measure", str(run_dir), str(Path(tmp) / f"out-{len(rows)}"),
                                                     args.layout))}
            rows.append(row)
            print(json.dumps(row))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
