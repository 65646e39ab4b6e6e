"""What the run records cost: the tracking sinks per metrics row, and the rollouts files per step.

Usage: python benchmarks/bench_tracking.py RUN_DIR [--repeats 3]

RUN_DIR is a finished run (e.g. `repro run --recipe tiny-cpu`). Its metrics.jsonl rows are replayed through each
sink (TensorBoard; W&B offline) started in a temporary run directory, as MetricsLog.append hands them over; printed:
the sink's start and close seconds, milliseconds per row (best of --repeats), and the bytes it left on disk. For
the rollouts: bytes per step of RUN_DIR/rollouts/ and the time the loop spent writing them (``timing_s/rollouts_file``
in the log), if the run wrote them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from repro.recipes import load_recipe  # noqa: E402
from repro.run.metrics_log import MetricsLog  # noqa: E402
from repro.run.sinks import TensorBoardSink, WandbSink  # noqa: E402


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def replay(name: str, start, rows: list[dict], repeats: int) -> None:
    per_row, opened, closed, size = [], [], [], 0
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            began = time.perf_counter()
            sink = start(Path(tmp))
            opened.append(time.perf_counter() - began)
            began = time.perf_counter()
            for row in rows:
                sink.log(row)
            per_row.append((time.perf_counter() - began) / len(rows))
            began = time.perf_counter()
            sink.close()
            closed.append(time.perf_counter() - began)
            size = folder_bytes(Path(tmp))
    print(f"{name:<12} start {min(opened):.2f} s (first {opened[0]:.2f} s), {min(per_row) * 1e3:.2f} ms per row "
          f"(median {statistics.median(per_row) * 1e3:.2f}), close {min(closed):.2f} s, {size / 1e3:.0f} kB on disk "
          f"for {len(rows)} rows")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = MetricsLog(args.run_dir / "metrics.jsonl").rows()
    recipe = load_recipe(args.run_dir / "recipe.yaml", ["tracking.wandb.enabled=true"])
    config = recipe.model_dump(mode="json")
    print(f"{args.run_dir}: {len(rows)} rows, {sum(r['kind'] == 'train' for r in rows)} steps")
    replay("tensorboard", lambda tmp: TensorBoardSink(tmp / "tensorboard", 0), rows, args.repeats)
    replay("wandb", lambda tmp: WandbSink(recipe.tracking.wandb, tmp, config, []), rows, args.repeats)
    files = sorted((args.run_dir / "rollouts").glob("step_*.jsonl.gz"))
    if files:
        sizes = [p.stat().st_size for p in files]
        seconds = [r["timing_s/rollouts_file"] for r in rows if "timing_s/rollouts_file" in r]
        print(f"rollouts     {len(files)} files, {statistics.mean(sizes) / 1e3:.1f} kB per step (min "
              f"{min(sizes) / 1e3:.1f}, max {max(sizes) / 1e3:.1f}), {sum(sizes) / 1e6:.2f} MB in all; writing "
              f"{statistics.median(seconds) * 1e3:.1f} ms per step (median; mean {statistics.mean(seconds) * 1e3:.1f})")


if __name__ == "__main__":
    main()
