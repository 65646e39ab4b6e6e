"""What it costs to move one step's rollout across a process boundary (rollout actor -> driver on Ray).

One real 32 x 8 rollout of the shipped tiny DeepSeek-V4 (routing recorded, as R3 needs), pickled and unpickled
two ways, interleaved: the trajectories as objects (one pickled tensor per log-prob row and routing table, how
they crossed before issue 19), and ``RolloutResult`` as it pickles now (stacked tensors + offsets,
``repro.rollout.types.pack_trajectories``). Prints the medians, the bytes, and the load average.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_rollout_pickle.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import time

import torch


def round_trip_ms(value) -> tuple[float, int]:
    start = time.perf_counter()
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    pickle.loads(data)
    return 1000 * (time.perf_counter() - start), len(data)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from repro.data.tinymath import TINY_PROMPT_TEMPLATE, train_problems
    from repro.model.warmstart_io import ensure_warm_checkpoint
    from repro.model.hf_folder import load_checkpoint
    from repro.rollout.embedded import EmbeddedEngine
    from repro.rollout.types import SamplingParams

    model, tok = load_checkpoint(ensure_warm_checkpoint())
    prompts = [tok(TINY_PROMPT_TEMPLATE.format(problem=p.problem)).input_ids for p in train_problems(n=32, seed=1)]
    engine = EmbeddedEngine(model, tok.eos_token_id, tok.pad_token_id, max_context=64)
    result = engine.generate(prompts, SamplingParams(n=8, temperature=0.8, max_new_tokens=16, seed=0))
    tensors = sum(1 + len(t.routing) for t in result.trajectories)
    times: dict[str, list[float]] = {"objects": [], "stacked": []}
    sizes = {}
    for _ in range(args.repeats):
        for name, value in (("objects", list(result.trajectories)), ("stacked", result)):
            ms, sizes[name] = round_trip_ms(value)
            times[name].append(ms)
    print(f"load={os.getloadavg()[0]:.2f} trajectories={len(result.trajectories)} tensors={tensors} "
          f"repeats={args.repeats}")
    for name, values in times.items():
        print(f"{name:8s} pickle+unpickle median {statistics.median(values):8.2f} ms   {sizes[name] / 1024:7.1f} KiB")
    print(f"objects / stacked = {statistics.median(times['objects']) / statistics.median(times['stacked']):.1f}x")


if __name__ == "__main__":
    main()
