"""Time to regenerate all figures (load the log, bootstrap the evals, draw, write PNG + SVG).

Usage: python benchmarks/bench_figures.py [--steps 75 10000] [--repeats 3]

Each size gets a seeded synthetic run dir (repro.analysis.synthetic); writing it is not timed. Goals: a 75-step
log in <= 5 s, a 10,000-step log in <= 30 s. Prints the best of --repeats and the load average, since on a
shared machine a slow time may be other people's work.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from repro.analysis.synthetic import write_synthetic_run
from repro.analysis.plots import make_all_figures

GOALS_S = {75: 5.0, 10_000: 30.0}


def time_figures(steps: int, repeats: int, root: Path) -> float:
    run_dir = write_synthetic_run(root / f"run_{steps}", steps=steps, seed=0)
    best = float("inf")
    for i in range(repeats):
        start = time.perf_counter()
        make_all_figures(run_dir, root / f"figures_{steps}_{i}")
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[75, 10_000])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for steps in args.steps:
            seconds = time_figures(steps, args.repeats, Path(tmp))
            goal = GOALS_S.get(steps)
            verdict = "" if goal is None else (f" (goal <= {goal:.0f} s: {'met' if seconds <= goal else 'MISSED'})")
            ok &= goal is None or seconds <= goal
            print(f"{steps:>6} steps: {seconds:.2f} s best of {args.repeats}{verdict}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
