"""What the papermill notebook suite costs over the CLI for the same work (goal: suite <= 1.2 x CLI).

Both sides do the same steps on the same recipe and overrides, in-process groups (no Ray start-up noise):
  CLI    repro run --steps 3 (the smoke run) -> repro run --steps N --resume -> repro figures -> repro compare
  suite  run_chain: 02 (3 steps) -> 03 (resumes to N) -> 10 -> 11 -> 12 -> 13 -> 20, each a papermill kernel
Each side runs in a fresh temp run dir; the ratio is suite wall time / CLI wall time. The fixed overhead
(kernel start-up, per-notebook imports) is also reported per notebook, so the ratio for a longer run can be
read off: overhead / (CLI time of that run).

    python benchmarks/bench_notebook_overhead.py [--steps 4] [--recipe tiny-cpu] [--set FIELD=VALUE ...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import repro

SMALL = ["algorithm.prompts_per_step=4", "algorithm.responses_per_prompt=2", "eval.samples_per_problem=1",
         "eval.at_start=false", "eval.every_steps=100", "checkpoint.every_steps=100"]


def cli(run_dir: Path, recipe: str, steps: int, overrides: list[str]) -> float:
    sets = [a for o in overrides for a in ("--set", o)]
    base = [sys.executable, "-m", "repro"]
    commands = [
        base + ["run", "--recipe", recipe, "--steps", "3", "--run-dir", str(run_dir), "--in-process", "--quiet", *sets],
        base + ["run", "--recipe", recipe, "--steps", str(steps), "--run-dir", str(run_dir), "--in-process", "--quiet",
                "--resume", *sets],
        base + ["figures", str(run_dir), "--out", str(run_dir / "figures")],
        base + ["compare", str(run_dir)],
    ]
    started = time.perf_counter()
    for command in commands:
        subprocess.run(command, check=True, cwd=repro.REPO_DIR, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def suite(run_dir: Path, recipe: str, steps: int, overrides: list[str]) -> tuple[float, dict]:
    from repro.notebooks import run_chain

    started = time.perf_counter()
    result = run_chain(run_dir, recipe, steps, overrides=overrides, in_process=True, figures_dir=run_dir / "figures",
                       skip=("00_cluster_check", "01_fp8_conversion"), smoke_dir=run_dir, log=lambda line: None)
    return time.perf_counter() - started, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="tiny-cpu")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--set", dest="overrides", action="append", default=None, metavar="FIELD=VALUE",
                        help="recipe overrides (default: the test suite's small run)")
    parser.add_argument("--suite-first", action="store_true", help="time the suite before the CLI (load drifts)")
    args = parser.parse_args()
    overrides = SMALL if args.overrides is None else args.overrides
    with tempfile.TemporaryDirectory(prefix="bench-nb-") as tmp:
        if args.suite_first:
            suite_s, result = suite(Path(tmp) / "suite", args.recipe, args.steps, overrides)
        cli_s = cli(Path(tmp) / "cli", args.recipe, args.steps, overrides)
        if not args.suite_first:
            suite_s, result = suite(Path(tmp) / "suite", args.recipe, args.steps, overrides)
    run_s = sum(result.results[n]["seconds"] for n in ("02_smoke_run", "03_full_run"))
    overhead = suite_s - run_s
    print(f"recipe {args.recipe}, {args.steps} steps, overrides {overrides}")
    print(f"CLI   (run, run --resume, figures, compare): {cli_s:7.1f} s")
    print(f"suite (02, 03, 10-13, 20 with papermill)   : {suite_s:7.1f} s   "
          f"ratio {suite_s / cli_s:.2f} x (goal <= 1.2)")
    print(f"  of which training inside 02+03            : {run_s:7.1f} s")
    print(f"  notebook overhead (kernels, imports, plots): {overhead:7.1f} s")
    for name, seconds in result.seconds.items():
        print(f"    {name:<20} {seconds:6.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
