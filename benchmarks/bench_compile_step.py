"""Is the tiny DeepSeek-V4's training step bound by op count, and does torch.compile pay for itself over a run?

On one trainer-shaped batch (256 rows: 7-token prompts + 12-token responses), the model cast and switched to the
entrywise hyper-connections as the embedded trainer runs it, it
reports (1) aten ops per forward + backward, counted with a TorchDispatchMode (exact on any machine, load or
not), and the share of them issued by the hyper-connections' Sinkhorn loop; (2) interleaved wall times of an eager
and a ``torch.compile``d forward + backward, the compile's one-off cost, and the steps it needs to pay it back
(the tiny run has 75).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_compile_step.py [--repeats 5] [--no-compile]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def training_batch(model, rows: int = 256, prompt: int = 7, response: int = 12):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (rows, prompt + response - 1), generator=gen)
    return ids


def step(model, ids) -> None:
    logits = model(input_ids=ids, use_cache=False).logits
    torch.log_softmax(logits.float() / 0.8, dim=-1).mean().backward()


def count_ops(model, ids, sinkhorn_iters: int) -> tuple[int, int]:
    """(all aten ops of one forward + backward, those of the Sinkhorn loop: the model with 1 iteration instead)."""
    counts = []
    for iters in (sinkhorn_iters, 1):
        copy_ = copy.deepcopy(model)
        for module in copy_.modules():
            if hasattr(module, "hc_sinkhorn_iters"):
                module.hc_sinkhorn_iters = iters
        with OpCounter() as counter:
            step(copy_, ids)
        counts.append(sum(counter.ops.values()))
    return counts[0], counts[0] - counts[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="the trainer's compute dtype")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from repro.model.warmstart_io import ensure_warm_checkpoint
    from repro.model.hf_folder import load_checkpoint

    from repro.model import layouts
    from repro.model.hyper_connection import use_entrywise_hyper_connections
    from repro.train.precision import cast_for_training

    model, _ = load_checkpoint(ensure_warm_checkpoint())
    model = cast_for_training(model, args.dtype, keep_fp32=layouts.keeps_fp32)  # as the embedded trainer runs it
    ids = training_batch(model)
    total, sinkhorn = count_ops(model, ids, model.config.hc_sinkhorn_iters)
    print(f"load={os.getloadavg()[0]:.2f} batch={tuple(ids.shape)} dtype={args.dtype}")
    print(f"aten ops per forward+backward, transformers' hyper-connections: {total:,}; Sinkhorn loop "
          f"({model.config.hc_sinkhorn_iters} iterations): {sinkhorn:,} ({100 * sinkhorn / total:.0f}%)")
    use_entrywise_hyper_connections(model)  # the trainer's
    total, sinkhorn = count_ops(model, ids, model.config.hc_sinkhorn_iters)
    print(f"aten ops per forward+backward, entrywise hyper-connections (the trainer's): {total:,}; Sinkhorn loop "
          f"{sinkhorn:,} ({100 * sinkhorn / total:.0f}%)")
    if args.no_compile:
        return
    compiled = torch.compile(copy.deepcopy(model))
    start = time.perf_counter()
    step(compiled, ids)
    compile_s = time.perf_counter() - start
    eager_s, compiled_s = [], []
    step(model, ids)
    for _ in range(args.repeats):
        for fn, out in ((model, eager_s), (compiled, compiled_s)):
            start = time.perf_counter()
            step(fn, ids)
            out.append(time.perf_counter() - start)
    eager, fast = statistics.median(eager_s), statistics.median(compiled_s)
    saving = eager - fast
    print(f"forward+backward: eager {eager:.3f} s, compiled {fast:.3f} s ({eager / fast:.2f}x); first compiled call "
          f"{compile_s:.1f} s; load={os.getloadavg()[0]:.2f}")
    payback = "never" if saving <= 0 else f"{(compile_s - fast) / saving:.0f} steps"
    print(f"compile pays back after {payback} (one such forward+backward per step; the tiny run has 75)")


if __name__ == "__main__":
    main()
