"""Device check for whoever has a CUDA or ROCm GPU: the production path the CPU-only test machines cannot run.

    python benchmarks/device_check.py [--out DIR]           (about 5-8 minutes on one GPU)
    python benchmarks/device_check.py --cpu-dry-run         (the same launches on this CPU: vLLM + megatron lane)

Not part of `make test` (tests/test_device_check.py runs it on a CPU, where every GPU check says SKIP). Each check
is a ``(name, function)`` returning ``(status, detail)``, status PASS, FAIL or SKIP; each runs under its own
try/except (an exception is its FAIL); a table is printed and ``device_check.json`` written to $OUT if set, else to
--out (default runs/device_check); the exit code is 1 if any check FAILed.

Everything below is what a user runs: ``repro check`` and ``repro launch`` as subprocesses, on a tiny Qwen3-MoE
built by ``repro.model.tiny_qwen3_moe`` and trained through the Megatron provider (``repro.train.megatron.qwen3``),
served by vLLM. Nothing is moved to the device or handed over by hand: the launch places the trainer rank and the
vLLM rollout through Ray, the trainer moves its model and micro-batches, the sync packs where its transport says.

1. ``repro_check``: ``repro check`` for the AMD recipe (informational: one GPU is not the cluster; the accelerator,
   FP8 format, Transformer Engine and versions rows are what to read).
2. ``launch``: ``repro launch`` for 3 steps. One GPU: trainer and rollout share it through fractional Ray GPU
   resources (``cluster.colocate=gpu``), and the sync is repro's stream over gloo -- NCCL refuses two ranks on one
   GPU ("Duplicate GPU detected"). Two or more: the rollout on its own GPU (``colocate=node``), repro's stream over
   NCCL. A NaN is injected into update 2's gradient (``REPRO_FAULT_NAN_GRADIENT_AT_UPDATE``): PASS when steps 1 and
   3 have a finite ``actor/grad_norm``, step 2's is NaN (skipped) and training goes on (step 3's loss finite, sync
   versions 1-3). The untrained tiny model scores no reward, so its advantages (and norms) are 0: a real update's
   non-zero norm is checked by ``megatron_trainer_step`` below.
3. ``resume``: ``repro launch --resume --steps 4`` on that run: PASS when step 4 is trained from step 3's
   checkpoint (Megatron's dist checkpoint with megatron's own optimizer state) and steps 1-3 are kept.
4. ``vllm_engine_sync``: two or more GPUs only: 2 steps with vLLM's own weight-transfer engine (NCCL) carrying the
   sync. SKIP on one GPU (NCCL cannot pair two ranks on it).
5. ``benchmarks/device_check_megatron.py``'s checks through MegatronTrainer: a lone rank's update on a batch with
   non-zero advantages (its norm, a NaN-gradient skip), megatron's distributed CPU-offloaded optimizer (AMD's
   mapping), and its dist checkpoint round trip.

Not run here: AMD's 24-GPU layout (PP 4 senders, TP8 rollout), block-FP8 serving (the tiny model's 64-wide matrices
are narrower than a 128x128 block), ROCm-specific kernels. The same script runs on ROCm (torch's cuda API is HIP's).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
BUDGET_S = 480  # the ~8 minutes a device slot gives this check
LAUNCH_TIMEOUT_S = 240
NAN_UPDATE = 2
Check = tuple[str, Callable[[], tuple[str, str]]]
CLI = ("import sys; from repro import cli; "
       "cli.COMMANDS.setdefault('check', ('repro.commands.check', 'cluster readiness')); sys.exit(cli.main())")


def gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _installed(package: str) -> bool:
    """A real package (a folder of the same name, e.g. tests/vllm on sys.path, is a namespace without an origin)."""
    try:
        spec = importlib.util.find_spec(package)
    except ModuleNotFoundError:  # "a.b" whose parent "a" is absent
        return False
    return spec is not None and spec.origin is not None


def _missing_stack() -> str | None:
    missing = [m for m in ("vllm", "megatron.core") if not _installed(m)]
    return f"not installed here: {', '.join(missing)}" if missing else None


def recipe_sets(model_dir: Path, gpu_count: int, vllm_engine: bool = False) -> list[str]:
    """The tiny-cpu recipe on this machine: a Megatron trainer rank and a vLLM rollout (``gpu_count`` 0: the CPU
    lane's settings, fp32 Megatron as `make test-vllm` runs it)."""
    sets = ["actor.backend=megatron", "actor.num_workers=1", "actor.model_provider=repro.train.megatron.qwen3:provider",
            f"model.path={model_dir}", "rollout.backend=vllm", "rollout.logprobs_mode=processed",
            "eval.at_start=false", "eval.after_first_update=false", "eval.samples_per_problem=1",
            "checkpoint.every_steps=1", "cluster.ray_address=null",
            f"weight_sync.vllm_engine={str(vllm_engine).lower()}"]
    if gpu_count == 0:
        return sets + ["actor.dtype=fp32"]
    import torch

    accelerator = "rocm" if getattr(torch.version, "hip", None) else "cuda"
    return sets + [f"cluster.accelerator={accelerator}", f"cluster.gpus_per_node={gpu_count}",
                   f"cluster.colocate={'gpu' if gpu_count == 1 else 'node'}",
                   "rollout.weight_format=bf16", "rollout.kv_cache_dtype=auto", "rollout.activation_dtype=bf16",
                   "rollout.gpu_memory_utilization=0.3"]


def launch(out: Path, run_dir: Path, sets: list[str], steps: int, resume: bool = False,
           env: dict[str, str] | None = None) -> tuple[int, str]:
    """`repro launch` as a user types it; (exit code, last lines of its output)."""
    args = [sys.executable, "-m", "repro", "launch", "--recipe", "tiny-cpu", "--steps", str(steps),
            "--run-dir", str(run_dir), "--quiet"] + [a for s in sets for a in ("--set", s)] + (["--resume"] * resume)
    environment = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
    started = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, cwd=REPO, env=environment)
    log = out / f"{run_dir.name}{'-resume' if resume else ''}.log"
    log.write_text(" ".join(args) + "\n\n" + done.stdout + "\n" + done.stderr)
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
    print(f"-- {run_dir.name}: exit {done.returncode} in {time.monotonic() - started:.0f} s (log {log})", flush=True)
    return done.returncode, tail


def train_rows(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r for r in rows if r.get("kind") == "train"}


def finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


class Launches:
    """The runs the checks share (one launch serves the launch check, its resume the next)."""

    def __init__(self, out: Path, gpu_count: int):
        self.out, self.gpu_count = out, gpu_count
        self.model_dir: Path | None = None
        self.first: tuple[int, str] | None = None

    def model(self) -> Path:
        if self.model_dir is None:
            from repro.model.tiny_qwen3_moe import build_tiny_math_qwen3_moe

            self.model_dir = build_tiny_math_qwen3_moe(self.out / "tiny-qwen3-moe", seed=0)
        return self.model_dir

    def check_launch(self) -> tuple[str, str]:
        sets = recipe_sets(self.model(), self.gpu_count)
        self.first = launch(self.out, self.out / "run", sets, steps=3,
                            env={"REPRO_FAULT_NAN_GRADIENT_AT_UPDATE": str(NAN_UPDATE)})
        code, tail = self.first
        if code != 0:
            return "FAIL", f"repro launch exit {code}: {tail}"
        rows = train_rows(self.out / "run")
        norms = {s: rows[s].get("actor/grad_norm") for s in sorted(rows)}
        versions = [rows[s].get("weight_sync/version") for s in sorted(rows)]
        transport = "gloo (one GPU shared)" if self.gpu_count == 1 else "NCCL" if self.gpu_count else "gloo (CPU)"
        # finite on the others; zero where every advantage was 0 (the untrained tiny model scores no reward: the
        # non-zero norm of a real update is megatron_trainer_step's check)
        ok = (sorted(rows) == [1, 2, 3] and versions == [1, 2, 3] and not finite(norms[NAN_UPDATE])
              and all(finite(norms[s]) for s in (1, 3)) and finite(rows[3].get("actor/loss")))
        return ("PASS" if ok else "FAIL"), (f"3 steps, repro's stream over {transport}; grad_norm by step {norms} "
                                            f"(NaN injected into update {NAN_UPDATE}: skipped); "
                                            f"sync versions {versions}")

    def check_resume(self) -> tuple[str, str]:
        if self.first is None or self.first[0] != 0:
            return "SKIP", "the launch check did not complete a run to resume"
        run = self.out / "run"
        before = train_rows(run)
        code, tail = launch(self.out, run, recipe_sets(self.model(), self.gpu_count), steps=4, resume=True)
        if code != 0:
            return "FAIL", f"repro launch --resume exit {code}: {tail}"
        after = train_rows(run)
        kept = all(after[s].get("actor/loss") == before[s].get("actor/loss") for s in before
                   if finite(before[s].get("actor/loss")))
        norm = after.get(4, {}).get("actor/grad_norm")
        ok = sorted(after) == [1, 2, 3, 4] and kept and finite(norm)
        return ("PASS" if ok else "FAIL"), f"steps {sorted(after)}; step 4 grad_norm {norm}; steps 1-3 kept: {kept}"

    def check_vllm_engine(self) -> tuple[str, str]:
        if self.gpu_count < 2:
            return "SKIP", ("needs 2 GPUs: vLLM's weight-transfer engine is NCCL, which refuses two ranks on one GPU"
                            if self.gpu_count == 1 else "vLLM's weight-transfer engine runs on GPUs only")
        run = self.out / "run-vllm-engine"
        code, tail = launch(self.out, run, recipe_sets(self.model(), self.gpu_count, vllm_engine=True), steps=2)
        if code != 0:
            return "FAIL", f"repro launch exit {code}: {tail}"
        rows = train_rows(run)
        versions = [rows[s].get("weight_sync/version") for s in sorted(rows)]
        ok = versions == [1, 2] and all(finite(rows[s].get("actor/grad_norm")) for s in rows)
        return ("PASS" if ok else "FAIL"), (f"2 steps through vLLM's NCCL weight-transfer engine; "
                                            f"sync versions {versions}")


def step_repro_check(out: Path) -> tuple[str, str]:
    path = out / "repro_check_amd.json"
    done = subprocess.run([sys.executable, "-c", CLI, "check", "--recipe", "amd-dsv4-flash-mi308x", "--json", str(path),
                           "--run-dir", str(out / "check")], capture_output=True, text=True, timeout=120, cwd=REPO)
    print(done.stdout[-6000:], done.stderr[-2000:], sep="\n")
    rows = {r["check"]: r for r in json.loads(path.read_text())} if path.exists() else {}
    seen = {k: rows[k]["status"] for k in ("accelerator", "fp8_format", "torch", "transformer_engine") if k in rows}
    return ("PASS" if rows else "FAIL"), f"informational, exit {done.returncode}; {seen}"


def _load(name: str):
    """A module of benchmarks/ by file (benchmarks/ is no package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def checks(out: Path, deadline: float, cpu_dry_run: bool = False) -> list[Check]:
    """The checks in order; on a machine without a GPU (and no --cpu-dry-run) the launches SKIP."""
    count = gpus()
    launches = Launches(out, count)
    why_not = _missing_stack() or (None if count or cpu_dry_run else "no CUDA/ROCm device visible to torch")

    def needs_stack(check: Callable[[], tuple[str, str]]) -> Callable[[], tuple[str, str]]:
        def run() -> tuple[str, str]:
            if why_not:
                return "SKIP", why_not
            if deadline - time.monotonic() < 60:
                return "SKIP", f"less than a minute left of the {BUDGET_S} s budget"
            return check()
        return run

    named: list[Check] = [("repro_check", lambda: step_repro_check(out)),
                          ("launch", needs_stack(launches.check_launch)),
                          ("resume", needs_stack(launches.check_resume)),
                          ("vllm_engine_sync", needs_stack(launches.check_vllm_engine))]
    megatron_checks = _load("device_check_megatron")
    megatron_checks.CPU_DRY_RUN = cpu_dry_run
    return named + list(megatron_checks.CHECKS)


def run_checks(named: list[Check]) -> dict[str, dict]:
    report = {}
    for name, check in named:
        started = time.monotonic()
        try:
            status, detail = check()
            if status not in ("PASS", "FAIL", "SKIP"):
                status, detail = "FAIL", f"the check answered {status!r}, not PASS/FAIL/SKIP: {detail}"
        except Exception as err:  # one broken check must not hide the others
            status, detail = "FAIL", f"{type(err).__name__}: {err}"
        report[name] = {"status": status, "detail": detail, "seconds": round(time.monotonic() - started, 1)}
        print(f"== {name}: {status} ({report[name]['seconds']} s) {detail}", flush=True)
    return report


def print_table(report: dict[str, dict]) -> None:
    width = max(len(n) for n in report)
    print(f"\n{'check':<{width}}  status  seconds  detail")
    for name, r in report.items():
        print(f"{name:<{width}}  {r['status']:<6}  {r['seconds']:7.1f}  {r['detail'][:160]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "runs" / "device_check"),
                        help="where device_check.json goes ($OUT if set)")
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="run the launches on this CPU (needs vLLM and megatron-core: the vLLM lane's venv)")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    deadline = time.monotonic() + BUDGET_S
    report = run_checks(checks(out, deadline, args.cpu_dry_run))
    print_table(report)
    path = out / "device_check.json"
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(report, indent=2) + "\n")
    partial.replace(path)
    return 1 if any(r["status"] == "FAIL" for r in report.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
