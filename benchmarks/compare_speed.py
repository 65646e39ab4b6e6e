"""Two checkouts' RL step side by side: the tiny recipe's step seconds, on Ray and in one process, interleaved.

    python benchmarks/compare_speed.py TREE_A TREE_B [--rounds 3] [--steps 6] [--recipe tiny-cpu]
        [--modes ray,in-process]

Each round runs ``python -m repro run --recipe R --steps S --quiet`` (and with ``--in-process``) once per tree,
the trees' order alternating from round to round (A B, B A, ...) so that a change of the machine's load hits both
alike; every run starts from scratch in a run directory of its own under a temporary folder, with
``PYTHONPATH`` set to its tree and the same Python as this script. It reads each run's ``metrics.jsonl`` and
prints, per mode and tree, the median over rounds and steps of ``timing_s/rollout``, ``update``, ``sync`` and
``step``; the first step of every run is left out when there are more (it warms the caches), as is the
evaluation. B/A is the ratio of the medians. Time it on an otherwise idle machine: on a loaded one the table
says how the load fell, not what the trees cost.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

PHASES = ("rollout", "update", "sync", "step")


def run_once(tree: Path, mode: str, recipe: str, steps: int, run_dir: Path) -> list[dict]:
    """One run of ``tree``'s repro; its train rows (raises with the run's last output on a failure)."""
    command = [sys.executable, "-m", "repro", "run", "--recipe", recipe, "--steps", str(steps), "--run-dir",
               str(run_dir), "--quiet"] + (["--in-process"] if mode == "in-process" else [])
    env = {**os.environ, "PYTHONPATH": str(tree), "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    for attempt in range(3):  # Ray's raylet may miss its fixed 30 s start-up window on a loaded machine: try again
        shutil.rmtree(run_dir, ignore_errors=True)
        proc = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
        if proc.returncode == 0 or "timed out during startup" not in proc.stdout + proc.stderr:
            break
        print(f"{tree} ({mode}): Ray timed out starting, try {attempt + 2} of 3", flush=True)
    if proc.returncode:
        raise SystemExit(f"{tree} ({mode}) failed with exit code {proc.returncode}:\n"
                         f"{(proc.stdout + proc.stderr)[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("kind") == "train"]


def step_times(rows: list[dict]) -> dict[str, list[float]]:
    """Each phase's seconds over the run's steps, the first left out when there are more."""
    kept = rows[1:] if len(rows) > 1 else rows
    return {phase: [r[f"timing_s/{phase}"] for r in kept if f"timing_s/{phase}" in r] for phase in PHASES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree_a", type=Path)
    parser.add_argument("tree_b", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--recipe", default="tiny-cpu")
    parser.add_argument("--modes", default="ray,in-process", help="comma-separated: ray, in-process")
    args = parser.parse_args()
    trees = {"A": args.tree_a.resolve(), "B": args.tree_b.resolve()}
    for label, tree in trees.items():
        if not (tree / "repro" / "__init__.py").is_file():
            parser.error(f"tree_{label.lower()}: {tree} is not a checkout of repro (no repro/__init__.py there)")
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be at least 1")
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        if mode not in ("ray", "in-process"):
            raise SystemExit(f"--modes: {mode!r} is not ray or in-process")
    times: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="compare_speed-") as tmp:
        for round_ in range(args.rounds):
            order = ["A", "B"] if round_ % 2 == 0 else ["B", "A"]
            for mode in modes:
                for label in order:
                    run_dir = Path(tmp) / f"{label}-{mode}-{round_}"
                    for phase, values in step_times(run_once(trees[label], mode, args.recipe, args.steps,
                                                             run_dir)).items():
                        times[(mode, label)][phase].extend(values)
                    print(f"round {round_ + 1}/{args.rounds} {mode:<10} {label}: step "
                          f"{statistics.median(times[(mode, label)]['step']):.3f} s (median so far)", flush=True)
    load = os.getloadavg()
    print(f"\nA = {trees['A']}\nB = {trees['B']}\n{args.rounds} rounds x {args.steps} steps of {args.recipe}, "
          f"medians in seconds; load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"{time.perf_counter() - started:.0f} s in all")
    print(f"{'mode':<11}{'phase':<9}{'A':>9}{'B':>9}{'B/A':>7}{'n':>5}")
    for mode in modes:
        for phase in PHASES:
            a, b = times[(mode, "A")][phase], times[(mode, "B")][phase]
            if not a or not b:
                continue
            ma, mb = statistics.median(a), statistics.median(b)
            print(f"{mode:<11}{phase:<9}{ma:>9.3f}{mb:>9.3f}{mb / ma:>7.2f}{len(a):>5}")
    if set(modes) == {"ray", "in-process"}:
        for label in ("A", "B"):
            overhead = statistics.median(times[("ray", label)]["step"]) - statistics.median(
                times[("in-process", label)]["step"])
            print(f"Ray overhead per step, {label}: {overhead:+.3f} s (Ray step - in-process step, medians)")


if __name__ == "__main__":
    main()
