"""repro's RL step against TRL 1.16's GRPOTrainer: same checkpoint (the shipped tiny DeepSeek-V4), same prompts
(tiny-math training problems, the tiny template), same sampling (32 prompts x 8 responses, T=0.8, top-p 1, up to
16 new tokens) and optimizer settings (lr 5e-5 constant, clip 0.2/0.28, no KL), runs interleaved: repro, TRL,
repro, TRL ... Each run's steps 2..N (step 1 warms up) give a median; the medians over runs are printed with
their ratio and the load average before and after.

What each side does per step: TRL samples with HF ``generate`` and takes one GRPO update (no FP8 rollout, no
routing replay, no importance correction, no weight sync: its policy samples itself); repro does all of those
(``repro.run.loop``). Which prompts each step draws differs (each side shuffles with its own sampler).

TRL lives in its own venv so the project's pins stay intact; ``--setup`` builds it (Python 3.11, torch 2.13.0 CPU,
trl 1.16, the lock's transformers), and a side's run is a subprocess: ``benchmarks/trl_side/grpo_steps.py``.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_step_vs_trl.py --setup
    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_step_vs_trl.py [--runs 5] [--steps 12] [--in-process]
        [--variant 'LABEL|TREE|field=value,field=value' ...]

A variant is repro run from checkout TREE (empty: this one; another worktree gives a "before" column) with those
recipe overrides; several variants are interleaved with TRL in every run, and each is compared to TRL.
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
from contextlib import ExitStack
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TRL_VENV = HERE / ".venv-trl"
TRL_PINS = ["trl==1.16.*", "transformers==5.24.0", "safetensors"]


def setup() -> None:
    """The TRL venv: torch first (the CPU wheel, so pip does not pull a CUDA build), then TRL at the lock's pins."""
    if not (TRL_VENV / "bin" / "python").exists():
        subprocess.run(["python3.11", "-m", "venv", str(TRL_VENV)], check=True)
    pip = [str(TRL_VENV / "bin" / "pip"), "install", "-q"]
    subprocess.run(pip + ["torch==2.13.0"], check=True)
    subprocess.run(pip + TRL_PINS, check=True)


def child_env(threads: int) -> dict[str, str]:
    # Ray 2.60 waits a fixed 30 s for the raylet (ray/_private/node.py, no setting): a loaded machine is retried
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(threads), "RAY_AUTH_MODE": "disabled"}


def parse_variant(text: str) -> tuple[str, Path, list[str]]:
    label, tree, overrides = (text.split("|") + ["", ""])[:3]
    return label, Path(tree).resolve() if tree else REPO, [o for o in overrides.split(",") if o]


def repro_step_seconds(steps: int, tree: Path, overrides: list[str], in_process: bool, threads: int) -> list[float]:
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = str(Path(scratch) / "run")
        command = [sys.executable, "-m", "repro", "run", "--recipe", "tiny-cpu", "--steps", str(steps), "--quiet",
                   "--run-dir", run_dir, "--set", "eval.at_start=false", "--set", "eval.every_steps=1000",
                   "--set", "checkpoint.every_steps=1000"]
        for item in overrides:
            command += ["--set", item]
        if in_process:
            command.append("--in-process")
        env = {**child_env(threads), "PYTHONPATH": str(tree)}
        if subprocess.run(command, cwd=tree, env=env, stdout=subprocess.DEVNULL).returncode != 0:
            print("repro run failed (on a loaded machine Ray's start-up can time out): retrying once", flush=True)
            shutil.rmtree(run_dir, ignore_errors=True)
            subprocess.run(command, check=True, cwd=tree, env=env, stdout=subprocess.DEVNULL)
        rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r["timing_s/step"] for r in rows if r["kind"] == "train"]


def trl_step_seconds(steps: int, threads: int, gradient_checkpointing: bool) -> list[float]:
    from repro.model.warmstart_io import ensure_warm_checkpoint

    python = TRL_VENV / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{TRL_VENV} is missing: run this benchmark with --setup first")
    command = [str(python), str(HERE / "trl_side" / "grpo_steps.py"), "--model", str(ensure_warm_checkpoint()),
               "--steps", str(steps), "--threads", str(threads), "--temperature", "0.8"]
    if gradient_checkpointing:
        command.append("--gradient-checkpointing")
    out = subprocess.run(command, check=True, cwd=REPO, env=child_env(threads), capture_output=True, text=True).stdout
    return [json.loads(line)["seconds"] for line in out.splitlines() if line.startswith('{"step"')]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--setup", action="store_true", help="build benchmarks/.venv-trl and exit")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of TRL and of an in-process repro")
    parser.add_argument("--in-process", action="store_true", help="repro without Ray (its groups in one process)")
    parser.add_argument("--variant", action="append", default=[], help="'LABEL|TREE|k=v,k=v', repeatable")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="TRL's, off by default")
    parser.add_argument("--shared-ray", action="store_true",
                        help="one local Ray instance that every repro run joins, as make repro's chain does: each "
                             "run skips Ray's ~10 s start (the step times are the same either way, measured)")
    args = parser.parse_args()
    if args.setup:
        setup()
        return
    with ExitStack() as stack:
        if args.shared_ray and not args.in_process:
            from repro.cluster.runtime import shared_local_instance
            from repro.recipes import load_recipe

            info = stack.enter_context(shared_local_instance(load_recipe("tiny-cpu")))
            print(f"shared local Ray instance at {info.address}" if info else "joining the Ray instance set already")
        compare(args)


def compare(args: argparse.Namespace) -> None:
    from bench_bf16_gemm import header  # which CPU kind and BF16 GEMM path this machine gives (docs/performance.md)

    print(header(), flush=True)
    variants = [parse_variant(v) for v in args.variant] or [("repro", REPO, [])]
    load_before = os.getloadavg()
    medians: dict[str, list[float]] = {label: [] for label, _, _ in variants} | {"TRL": []}
    for run in range(args.runs):
        for label, tree, overrides in variants:
            times = repro_step_seconds(args.steps, tree, overrides, args.in_process, args.threads)[1:]
            medians[label].append(statistics.median(times))
        medians["TRL"].append(statistics.median(trl_step_seconds(args.steps, args.threads,
                                                                 args.gradient_checkpointing)[1:]))
        print(f"run {run + 1}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in medians.items())
              + f" s/step; load {os.getloadavg()[0]:.2f}", flush=True)
    trl = statistics.median(medians["TRL"])
    side = "in-process" if args.in_process else "on Ray"
    print(f"load average before {load_before[0]:.2f} / after {os.getloadavg()[0]:.2f}; {args.runs} interleaved runs, "
          f"median of steps 2-{args.steps}, then over runs; repro {side}")
    print(f"{'side':40s} {'s/step':>8s} {'/ TRL':>7s}")
    for label, tree, overrides in variants:
        value = statistics.median(medians[label])
        print(f"{label + ' ' + ','.join(overrides):40s} {value:8.3f} {value / trl:6.2f}x")
    print(f"{'TRL 1.16 GRPOTrainer':40s} {trl:8.3f} {1.0:6.2f}x")

if __name__ == "__main__":
    main()
