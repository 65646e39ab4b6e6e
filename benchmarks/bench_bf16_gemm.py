"""The BF16 trainer's two GEMM paths on this CPU (``repro.train.bf16_gemm``): speed and numbers.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_bf16_gemm.py [--gemm] [--ulp] [--phases N] [--profile PATH]

Always prints which CPU kind and BF16 path this process sees (torch's CPU capability, the CPU's BF16 flags, whether
oneDNN computes BF16 here, what ``auto`` picks, and the environment variables that force either). Then:

- ``--gemm``: GFLOP/s of torch's BF16 matmul, torch's FP32 matmul and the fp32 path (widen, FP32 GEMM, round once)
  at the shapes of issue 41 and of the tiny trainer; best of several repeats.
- ``--ulp``: every BF16 GEMM call of one tiny-trainer update (forward, and the backward's input and weight
  gradients), captured with its operands on the native path and recomputed on the fp32 path: the largest BF16 ulp
  difference per call site, and each path's distance from the correctly rounded result (FP64 GEMM, one rounding).
  Then one whole forward + backward of the tiny model on both paths: logits and parameter gradients compared.
  Only meaningful where the native path is oneDNN's (the header says).
- ``--phases N``: the tiny recipe's steps in this process on both paths, alternating step by step (same prompts
  per step), the median seconds of the rollout, the update and the sync over steps 3..N of each path.
- ``--profile PATH``: the top torch ops of one update and one rollout on path PATH (native, fp32), one update thread.

Forcing the slow native path of an AVX2-only CPU on a CPU with native BF16 (docs/performance.md):
``DNNL_MAX_CPU_ISA=AVX2`` (oneDNN then reports no BF16 support, as on an AVX2 CPU, and torch falls back to ATen's
BF16 GEMM); ``ATEN_CPU_CAPABILITY=avx2`` and ``MKL_ENABLE_INSTRUCTIONS=AVX2`` narrow ATen's and MKL's kernels too.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from repro.train.bf16_gemm import ENV_VAR, FP32, NATIVE, cpu_bf16_facts

FORCING_VARS = ("DNNL_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", ENV_VAR,
                "OMP_NUM_THREADS")
ISSUE_SHAPES = [(2048, 256, 256), (4096, 256, 1024), (256, 256, 256)]
TINY_SHAPES = [(1600, 128, 64), (1600, 64, 256), (1600, 128, 25), (3200, 128, 128), (128, 1600, 128)]
GEMM_OPS = {"mm", "addmm", "bmm", "_grouped_mm", "baddbmm"}
aten = torch.ops.aten


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def header() -> str:
    facts = cpu_bf16_facts()
    forced = {k: os.environ[k] for k in FORCING_VARS if k in os.environ}
    forced["torch.backends.mkldnn.enabled"] = torch.backends.mkldnn.enabled
    return (f"CPU: {cpu_model()}, {os.cpu_count()} cores; torch {torch.__version__}, capability "
            f"{facts['cpu_capability']}; avx512_bf16 {facts['avx512_bf16']}, amx {facts['amx']}; oneDNN computes BF16 "
            f"here: {facts['onednn_bf16']}; BF16 GEMM path (auto): {facts['path']}\n"
            f"environment: {forced}; torch threads {torch.get_num_threads()}")


def best_seconds(fn, budget_s: float = 0.6, most: int = 50) -> float:
    fn()
    times, spent = [], 0.0
    while len(times) < most and (spent < budget_s or len(times) < 3):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        spent += times[-1]
    return min(times)


def gemm_table() -> None:
    print(f"\n{'m x k x n':<18} {'BF16 matmul':>16} {'FP32 matmul':>16} {'fp32 path':>16}   "
          "(ms, GFLOP/s; best of repeats)")
    g = torch.Generator().manual_seed(0)
    for m, k, n in ISSUE_SHAPES + TINY_SHAPES:
        a, b = (torch.randn(m, k, generator=g).bfloat16(), torch.randn(k, n, generator=g).bfloat16())
        af, bf = a.float(), b.float()
        cells = []
        for fn in (lambda: a @ b, lambda: af @ bf, lambda: (a.float() @ b.float()).bfloat16()):
            s = best_seconds(fn)
            cells.append(f"{s * 1e3:8.2f} {2 * m * k * n / s / 1e9:7.1f}")
        print(f"{f'{m}x{k}x{n}':<18} " + " ".join(f"{c:>16}" for c in cells))


# -- numbers ---------------------------------------------------------------------------------------------------
def ordered(bits: torch.Tensor) -> torch.Tensor:
    """BF16 values as integers in the order of the values (adjacent BF16 numbers differ by 1; +0 and -0 both 0)."""
    i = bits.view(torch.int16).to(torch.int32)
    return torch.where(i < 0, -(i & 0x7FFF), i)


def ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (ordered(a) - ordered(b)).abs()


class Capture(TorchDispatchMode):
    """Every aten GEMM with BF16 operands: (site, func, args, kwargs, output); site names forward or backward."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.__name__.split(".")[0] in GEMM_OPS and any(
                isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in args):
            node = torch._C._current_autograd_node()
            site = f"backward {node.name()}" if node is not None else "forward"
            keep = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)
            self.calls.append((site, func, keep, kwargs, out.detach().clone()))
        return out


def widened(args, dtype, absolute: bool = False):
    return tuple((a.abs() if absolute else a).to(dtype) if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16
                 else a for a in args)


def exact(func, args, kwargs, absolute: bool = False) -> torch.Tensor:
    """The GEMM in FP64 (exact to far below BF16's ulp at these sizes), not rounded; with ``absolute`` of the
    operands' absolute values: sum |a_i b_i| per element, the scale a cancelled result is small against."""
    if func is aten._grouped_mm.default:
        a, b = widened(args[:2], torch.float64, absolute)
        offs = kwargs.get("offs", args[2] if len(args) > 2 else None)
        ends = offs.tolist()
        if a.dim() == 2 and b.dim() == 2:  # the weight gradient: groups split the contraction, [G, m, n] out
            starts = [0] + ends[:-1]
            return torch.stack([a[:, s:e] @ b[s:e] for s, e in zip(starts, ends)])
        out, start = torch.zeros(a.shape[0], b.shape[-1], dtype=torch.float64), 0
        for group, end in enumerate(ends):
            out[start:end] = a[start:end] @ b[group]
            start = end
        return out
    return func(*widened(args, torch.float64, absolute), **kwargs)


CONDITION = 16.0  # elements whose |result| >= sum|a_i b_i| / 16: their ulps measure the path, not the cancellation


def ulp_table(recipe_name: str) -> None:
    batch, trainer = tiny_update_inputs(recipe_name, NATIVE)
    capture = Capture()
    with capture:
        trainer.scored_train_step(batch)
    # per (where, op): calls, elements, differing, max ulp, max ulp where well conditioned, the same vs exact (both)
    sites: dict[tuple, list] = defaultdict(lambda: [0, 0, 0, 0, 0, 0, 0])
    for site, func, args, kwargs, native in capture.calls:
        ours = func(*widened(args, torch.float32), **kwargs).bfloat16()
        value, scale = exact(func, args, kwargs), exact(func, args, kwargs, absolute=True)
        good = value.abs() * CONDITION >= scale
        rounded = value.bfloat16()
        d = ulps(native, ours)
        row = sites[(site.split()[-1], func.__name__.split(".")[0])]
        row[0] += 1
        row[1] += d.numel()
        row[2] += int((d > 0).sum())
        row[3] = max(row[3], int(d.max()))
        row[4] = max(row[4], int(d[good].max()) if good.any() else 0)
        row[5] = max(row[5], int(ulps(native, rounded)[good].max()) if good.any() else 0)
        row[6] = max(row[6], int(ulps(ours, rounded)[good].max()) if good.any() else 0)
    print(f"\n{len(capture.calls)} BF16 GEMM calls in one update of {recipe_name}, captured on the native path and "
          f"recomputed on the fp32 path (ulp: BF16 units in the last place; 'conditioned': elements with "
          f"|result| >= sum|a*b| / {CONDITION:g}; 'exact': the FP64 GEMM rounded once)")
    print(f"{'where':<24} {'op':<12} {'calls':>5} {'% differ':>8} {'max ulp':>8} {'conditioned':>11} "
          f"{'native-exact':>12} {'fp32-exact':>10}")
    for (site, op), (calls, total, differ, worst, good, native_exact, ours_exact) in sorted(sites.items()):
        print(f"{site[:24]:<24} {op:<12} {calls:>5} {100 * differ / total:>8.3f} {worst:>8} {good:>11} "
              f"{native_exact:>12} {ours_exact:>10}")
    whole_model()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def whole_model() -> None:
    """One forward + backward of the BF16 tiny model on both paths and of its FP32 twin (same BF16-valued
    weights): each path's distance from the FP32 computation beside the paths' distance from each other."""
    import copy

    from repro.model import layouts
    from repro.model.hyper_connection import use_entrywise_hyper_connections
    from repro.model.tiny import build_tiny_model
    from repro.train.bf16_gemm import FP32Gemms
    from repro.train.precision import cast_for_training

    model = cast_for_training(build_tiny_model(0), "bf16", keep_fp32=layouts.keeps_fp32)
    use_entrywise_hyper_connections(model)
    twin = copy.deepcopy(model).float()
    ids = torch.randint(3, 25, (128, 19), generator=torch.Generator().manual_seed(0))
    results = {}
    for name, net, context in (("native", model, None), ("fp32 path", model, FP32Gemms), ("FP32 model", twin, None)):
        net.zero_grad(set_to_none=True)
        with context() if context else torch.enable_grad():
            logits = net(input_ids=ids, use_cache=False).logits
        torch.log_softmax(logits.float(), -1)[..., 5].sum().backward()
        results[name] = (logits.detach().float(), {n: p.grad.float() for n, p in net.named_parameters()
                                                   if p.grad is not None})
    print("\nwhole tiny model, one forward + backward of 128 x 19 tokens: relative L2 distance of the logits, and the "
          "median / largest over the parameters' gradients")
    for a, b in (("native", "FP32 model"), ("fp32 path", "FP32 model"), ("fp32 path", "native")):
        (la, ga), (lb, gb) = results[a], results[b]
        rel = sorted(_rel(ga[n], gb[n]) for n in gb)
        print(f"  {a:<10} vs {b:<10}  logits {_rel(la, lb):.2e}  gradients median {statistics.median(rel):.2e}, "
              f"largest {rel[-1]:.2e}")


# -- steps -----------------------------------------------------------------------------------------------------
def tiny_update_inputs(recipe_name: str, path: str):
    """One real training batch of the recipe's first step and the embedded trainer (on ``path``, one update
    thread) that is to take it."""
    run = build_run(recipe_name, path, Path(tempfile.mkdtemp()), threads=1)
    return next_batch(run, 1), run.trainer.trainer


def build_run(recipe_name: str, path: str, run_dir: Path, threads: int | None = None):
    from repro.groups.workers import RolloutWorker, TrainerWorker
    from repro.recipes import load_recipe, resolve_path
    from repro.run.run_dir import open_run

    overrides = [f"actor.bf16_gemm={path}"] + ([f"actor.cpu_update_threads={threads}"] if threads else [])
    recipe = load_recipe(recipe_name, overrides)
    model_dir = resolve_path(recipe.model.path)
    return open_run(recipe, run_dir, TrainerWorker(recipe, model_dir), RolloutWorker(recipe, model_dir))


def next_batch(run, step: int):
    from repro.run.steps import generate_rollouts, make_train_batch, score_rollouts

    problems = run.sampler.next_batch()
    rollout = generate_rollouts(run, problems, step)
    return make_train_batch(run, rollout, score_rollouts(run, problems, rollout)).batch


def phases(recipe_name: str, steps: int) -> None:
    from repro.run.steps import StepClock, generate_rollouts, make_train_batch, score_rollouts, sync_weights
    from repro.run.steps import update_policy

    seconds = {path: defaultdict(list) for path in (NATIVE, FP32)}
    with tempfile.TemporaryDirectory() as tmp:
        runs = {path: build_run(recipe_name, path, Path(tmp) / path) for path in (NATIVE, FP32)}
        for step in range(1, steps + 1):
            for path, run in runs.items():
                clock = time.perf_counter
                problems = run.sampler.next_batch()
                start = clock()
                rollout = generate_rollouts(run, problems, step)
                seconds[path]["rollout"].append(clock() - start)
                batch = make_train_batch(run, rollout, score_rollouts(run, problems, rollout)).batch
                start = clock()
                update_policy(run, StepClock(), batch)
                seconds[path]["update"].append(clock() - start)
                start = clock()
                sync_weights(run.trainer, run.rollout, step)
                seconds[path]["sync"].append(clock() - start)
    print(f"\n{recipe_name} in this process, paths alternating step by step; median s over steps 3..{steps}")
    for path, phase in seconds.items():
        cells = {k: statistics.median(v[2:]) for k, v in phase.items()}
        print(f"  {path:<7} " + "  ".join(f"{k} {v:.3f}" for k, v in cells.items())
              + f"  sum {sum(cells.values()):.3f}")
    print(f"  load average now {os.getloadavg()[0]:.2f}")


def profile(recipe_name: str, path: str) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from repro.run.steps import StepClock, generate_rollouts, update_policy

    with tempfile.TemporaryDirectory() as tmp:
        run = build_run(recipe_name, path, Path(tmp), threads=1)
        for step in range(1, 3):
            from repro.run.steps import make_train_batch, score_rollouts

            problems = run.sampler.next_batch()
            with torch_profile(activities=[ProfilerActivity.CPU]) as rollout_prof:
                rollout = generate_rollouts(run, problems, step)
            batch = make_train_batch(run, rollout, score_rollouts(run, problems, rollout)).batch
            with torch_profile(activities=[ProfilerActivity.CPU]) as update_prof:
                update_policy(run, StepClock(), batch)
    for name, prof in (("update", update_prof), ("rollout", rollout_prof)):
        print(f"\ntop ops of one {name} on the {path} path (self CPU time, one update thread):")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=32))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="tiny-cpu")
    parser.add_argument("--gemm", action="store_true")
    parser.add_argument("--ulp", action="store_true")
    parser.add_argument("--phases", type=int, default=0, metavar="N")
    parser.add_argument("--profile", choices=(NATIVE, FP32))
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the Ray workers run 1)")
    parser.add_argument("--mkldnn-off", action="store_true", help="torch.backends.mkldnn.enabled = False first")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.mkldnn_off:
        torch.backends.mkldnn.enabled = False
    print(header(), flush=True)
    if args.gemm:
        gemm_table()
    if args.ulp:
        ulp_table(args.recipe)
    if args.phases:
        phases(args.recipe, args.phases)
    if args.profile:
        profile(args.recipe, args.profile)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
