"""How far the tiny recipe's RL step is from this machine's limit: FLOPs, aten ops and oneDNN primitives per phase.

    python benchmarks/step_limit.py [--steps 3] [--recipe tiny-cpu] [--json out.json]

Runs the recipe's steps in this process (both groups as plain objects, torch at one intra-op thread as the Ray
workers run; the update at the recipe's ``cpu_update_threads``), the first ``--warmup`` steps to warm caches, then
on the last step:

- **aten ops and FLOPs per phase** (rollout, update, sync): a ``TorchDispatchMode`` counts every aten op each
  thread runs (the update's threads each enter their own) and adds torch's FLOP formula per op;
  ``aten._grouped_mm`` (the routed experts), which torch's ``FlopCounterMode`` has no formula for, is counted
  here from its shapes: 2 x sum over groups of rows_g x K x N.
- **oneDNN primitives created per update**: ``torch.backends.mkldnn.verbose(VERBOSE_ON_CREATION)`` with this
  process's stdout sent to a file, counting ``create:cache_miss`` (a new primitive) and ``create:cache_hit``.
  Op counts and primitive counts do not depend on the machine's load.
- **the limit**: every GEMM call of the step (mm, addmm, bmm, _grouped_mm; by op, shapes and dtype) timed alone
  on this machine at its own shapes, then summed over the step's calls: the step's time if it did nothing but
  its GEMMs back to back at the rates this CPU reaches at those shapes. The update's limit is also shown divided
  by its threads. Timings (the phases' seconds and the GEMM rates) are taken on whatever load the machine has:
  the output says so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

GEMMS = {"mm", "addmm", "bmm", "_grouped_mm"}
aten = torch.ops.aten


def grouped_mm_flops(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None) -> int:
    """FLOPs of ``aten._grouped_mm(a, b, offs)``: a 2-D [M, K] with groups of rows ended at ``offs`` times b
    [G, K, N] is 2 * M * K * N (every row meets one group's matrix); the 3-D x 3-D form is a bmm."""
    if a.dim() == 2 and b.dim() == 3:
        return 2 * a.shape[0] * a.shape[1] * b.shape[-1]
    if a.dim() == 3 and b.dim() == 3:
        return 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[-1]
    if a.dim() == 2 and b.dim() == 2:  # 2-D x 2-D: groups split K, each [M, k_g] x [k_g, N]
        return 2 * a.shape[0] * a.shape[1] * b.shape[-1]
    raise ValueError(f"_grouped_mm of shapes {tuple(a.shape)} x {tuple(b.shape)}: no FLOP formula")


def _signature(args) -> tuple:
    return tuple((tuple(a.shape), str(a.dtype).removeprefix("torch.")) if isinstance(a, torch.Tensor) else a
                 for a in args if isinstance(a, torch.Tensor) or a is None)


class Tally:
    """Counts shared by every thread's counting mode (under a lock): ops, FLOPs by dtype, GEMM calls by shape."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ops: Counter = Counter()
        self.flops: Counter = Counter()
        self.gemms: Counter = Counter()  # (op, signature) -> calls
        self.gemm_args: dict = {}  # (op, signature) -> meta copies of its tensor arguments

    def add(self, func, args, kwargs, out) -> None:
        name = func.overloadpacket.__name__
        flops = 0
        if name == "_grouped_mm":
            flops = grouped_mm_flops(args[0], args[1], kwargs.get("offs", args[2] if len(args) > 2 else None))
        elif func.overloadpacket in flop_registry:
            flops = flop_registry[func.overloadpacket](*args, **kwargs, out_val=out)
        dtype = next((str(a.dtype).removeprefix("torch.") for a in args if isinstance(a, torch.Tensor)), "-")
        with self.lock:
            self.ops[name] += 1
            if flops:
                self.flops[dtype] += flops
            if name in GEMMS:
                key = (name, _signature(args))
                self.gemms[key] += 1
                if key not in self.gemm_args:
                    self.gemm_args[key] = (func, [a.detach().clone() if isinstance(a, torch.Tensor) else a
                                                  for a in args], dict(kwargs))


class Counting(TorchDispatchMode):
    def __init__(self, tally: Tally):
        super().__init__()
        self.tally = tally

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.tally.add(func, args, kwargs, out)
        return out


@contextlib.contextmanager
def counting(tally: Tally):
    """Count in this thread and in every update thread of ``repro.train.threads.ThreadedReplicas`` (a dispatch
    mode is per thread, so each job enters its own)."""
    from repro.train import threads

    original = threads.ThreadedReplicas.run

    def run(self, work):
        def wrap(job):
            def counted(model):
                with Counting(tally):
                    job(model)
            return counted
        return original(self, [[wrap(job) for job in jobs] for jobs in work])

    threads.ThreadedReplicas.run = run
    try:
        with Counting(tally):
            yield
    finally:
        threads.ThreadedReplicas.run = original


@contextlib.contextmanager
def onednn_primitives(counts: Counter):
    """oneDNN's creation log for the block (this process's fd 1 to a file meanwhile): counts cache misses and hits."""
    with tempfile.TemporaryFile(mode="w+b") as log:
        saved = os.dup(1)
        import sys
        sys.stdout.flush()
        os.dup2(log.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON_CREATION):
                yield
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        log.seek(0)
        for line in log.read().decode(errors="replace").splitlines():
            if line.startswith("onednn_verbose") and ",create:" in line:
                fields = line.split(",")
                kind = next(f for f in fields if f.startswith("create:"))
                counts[kind.removeprefix("create:")] += 1
                counts["kind:" + (fields[fields.index(kind) + 2] if len(fields) > fields.index(kind) + 2 else "?")] += 1


def gemm_seconds(tally: Tally, repeats: int) -> float:
    """Sum over the tally's GEMM calls of the median time of one call at its own shapes (args as recorded)."""
    total = 0.0
    for key, calls in tally.gemms.items():
        func, args, kwargs = tally.gemm_args[key]
        func(*args, **kwargs)  # warm (oneDNN primitive, MKL buffers)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            func(*args, **kwargs)
            times.append(time.perf_counter() - start)
        total += calls * statistics.median(times)
    return total


def build(recipe_name: str, run_dir: Path):
    from repro.groups.workers import RolloutWorker, TrainerWorker
    from repro.recipes import load_recipe, resolve_path
    from repro.run.run_dir import open_run

    recipe = load_recipe(recipe_name)
    model_dir = resolve_path(recipe.model.path)
    trainer, rollout = TrainerWorker(recipe, model_dir), RolloutWorker(recipe, model_dir)
    return open_run(recipe, run_dir, trainer, rollout)


def one_step(run, step: int, seconds: dict, tallies: dict | None = None, primitives: Counter | None = None) -> None:
    """The loop's step (``repro.run.loop.train``), each phase timed and, with ``tallies``, counted."""
    from repro.run.steps import StepClock, generate_rollouts, make_train_batch, score_rollouts, sync_weights
    from repro.run.steps import update_policy

    def phase(name, fn, *args, prims=None):
        context = counting(tallies[name]) if tallies is not None else contextlib.nullcontext()
        prim_context = onednn_primitives(prims) if prims is not None else contextlib.nullcontext()
        start = time.perf_counter()
        with context, prim_context:
            out = fn(*args)
        seconds[name].append(time.perf_counter() - start)
        return out

    problems = run.sampler.next_batch()
    rollout = phase("rollout", generate_rollouts, run, problems, step)
    rewards = score_rollouts(run, problems, rollout)
    grouped = phase("batch", make_train_batch, run, rollout, rewards)
    phase("update", update_policy, run, StepClock(), grouped.batch, prims=primitives)
    phase("sync", sync_weights, run.trainer, run.rollout, step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="tiny-cpu")
    parser.add_argument("--warmup", type=int, default=2, help="steps run before the measured ones")
    parser.add_argument("--steps", type=int, default=3, help="timed steps (after the warm-up); the last is counted")
    parser.add_argument("--gemm-repeats", type=int, default=20)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the Ray workers (OMP_NUM_THREADS=1); the update's threads are the recipe's
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        run = build(args.recipe, Path(tmp))
        seconds: dict[str, list[float]] = defaultdict(list)
        for step in range(1, args.warmup + 1):
            one_step(run, step, defaultdict(list))
        for step in range(args.warmup + 1, args.warmup + args.steps):
            one_step(run, step, seconds)
        tallies = {name: Tally() for name in ("rollout", "batch", "update", "sync")}
        primitives: Counter = Counter()
        forwards = count_forwards(run)
        one_step(run, args.warmup + args.steps, defaultdict(list), tallies, primitives)
        decode_forwards = forwards()
        one_step(run, args.warmup + args.steps + 1, seconds)
    update_threads = run.recipe.actor.cpu_update_threads
    report = {"recipe": args.recipe, "torch": torch.__version__, "threads": torch.get_num_threads(),
              "update_threads": update_threads, "decode_forwards": decode_forwards,
              "load_average_at_end": os.getloadavg(), "phases": {}}
    print(f"step_limit: {args.recipe}, torch {torch.__version__}, 1 intra-op thread, update threads {update_threads}")
    print("  op and primitive counts: load-independent. seconds: measured under the machine's current load "
          f"(load average now {os.getloadavg()[0]:.2f}), median of {len(seconds['rollout'])} steps.")
    header = f"{'phase':<8} {'aten ops':>9} {'GFLOP':>8} {'by dtype (GFLOP)':<32} {'GEMM calls':>10} " \
             f"{'measured s':>10} {'limit s':>8} {'meas/limit':>10}"
    print(header)
    total_measured = total_limit = 0.0
    for name, tally in tallies.items():
        limit = gemm_seconds(tally, args.gemm_repeats)
        if name == "update":
            limit /= update_threads
        measured = statistics.median(seconds[name])
        total_measured += measured
        total_limit += limit
        ops = sum(tally.ops.values())
        dtypes = ", ".join(f"{k} {v / 1e9:.2f}" for k, v in sorted(tally.flops.items()))
        ratio = measured / limit if limit else float("inf")
        print(f"{name:<8} {ops:>9,} {sum(tally.flops.values()) / 1e9:>8.2f} {dtypes:<32} "
              f"{sum(tally.gemms.values()):>10,} {measured:>10.3f} {limit:>8.4f} {ratio:>10.1f}")
        report["phases"][name] = {"aten_ops": ops, "flops": dict(tally.flops), "gemm_calls": sum(tally.gemms.values()),
                                  "measured_s_under_load": measured, "limit_s": limit,
                                  "top_ops": tally.ops.most_common(15)}
    print(f"{'step':<8} {'':>9} {'':>8} {'':<32} {'':>10} {total_measured:>10.3f} {total_limit:>8.4f} "
          f"{total_measured / total_limit:>10.1f}")
    rollout_ops = report["phases"]["rollout"]["aten_ops"]
    print(f"decode forwards in the counted rollout: {decode_forwards}; aten ops per forward (rollout ops / forwards): "
          f"{rollout_ops / max(decode_forwards, 1):,.0f}")
    created = {k: v for k, v in primitives.items()}
    print(f"oneDNN primitives in the counted update: created (cache_miss) {primitives['cache_miss']}, "
          f"cache hits {primitives['cache_hit']}; "
          f"by kind {[(k, v) for k, v in created.items() if k.startswith('kind:')]}")
    report["onednn_update"] = created
    report["step"] = {"measured_s_under_load": total_measured, "limit_s": total_limit}
    for name in ("rollout", "update"):
        print(f"top ops, {name}: " + ", ".join(f"{k} {v}" for k, v in tallies[name].ops.most_common(12)))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))


def count_forwards(run):
    """A counter of the rollout model's forward calls from now on (the embedded engine's decode/prefill passes)."""
    model = run.rollout.engine.model
    calls = [0]
    handle = model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))

    def read() -> int:
        handle.remove()
        return calls[0]
    return read


if __name__ == "__main__":
    main()
