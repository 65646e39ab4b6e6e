"""`repro repro` (what `make repro` runs): the main job on a recipe, end to end, printing where outputs are.

Chain: warm-started tiny checkpoint (regenerated if missing) -> the RL run (75 steps on Ray, checkpoints,
evaluations) -> figures and the comparison with AMD's numbers (where those parts are installed).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from repro.commands import run as run_command


def add_arguments(parser):
    parser.add_argument("--recipe", default="tiny-cpu", help="recipe to run (default tiny-cpu)")
    parser.add_argument("--run-dir", default="runs/tiny-cpu", help="run directory")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the recipe's)")
    parser.add_argument("--fresh", action="store_true", help="delete an existing run directory first")


def run(args) -> int:
    import shutil

    started = time.perf_counter()
    run_dir = Path(args.run_dir)
    if args.fresh and run_dir.exists():
        shutil.rmtree(run_dir)
    resume = (run_dir / "metrics.jsonl").exists()
    if resume:
        print(f"{run_dir} holds a run: resuming it (pass --fresh to start over)")
    run_args = argparse.Namespace(
        recipe=args.recipe, steps=args.steps, run_dir=str(run_dir), resume=resume, overrides=[],
        in_process=False, quiet=False,
    )
    run_command.execute(run_args)
    outputs = [run_dir / "metrics.jsonl", run_dir / "metrics.parquet", run_dir / "eval", run_dir / "checkpoints"]
    print(f"\nrepro: done in {time.perf_counter() - started:.0f} s. Outputs:")
    for path in outputs:
        print(f"  {path}")
    return 0
