"""The embedded trainer's update alone, each saving on its own: the hyper-connections entry by entry
(``repro.model.hyper_connection``) and the update's rows on two threads (``repro.train.threads``).

One trainer-shaped batch of the tiny recipe (32 prompts x 8 responses: 7 prompt tokens, 6-16 response tokens,
prompt groups whose rewards all agree -- advantage 0 -- as often as in the tiny run's first steps, the routing
recorded from the model as the rollout records it) and ``scored_train_step`` -- the update, its pi_old from its
own forward and the no-grad scoring of the zero-advantage rows, as the tiny recipe runs it -- timed on each
trainer in turn, repeatedly (interleaved, so load drifts hit all sides alike), one intra-op thread each.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_update_threads.py [--repeats 9]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def trainer_batch(model, prompts: int = 32, group: int = 8, zero_share: float = 0.3, seed: int = 0):
    from repro.algos import logprobs_from_logits
    from repro.model.routing import RoutingRecorder
    from repro.rollout.types import FinishReason, Trajectory
    from repro.train.batch import build_batch

    gen = torch.Generator().manual_seed(seed)
    vocab, eos, pad = model.config.vocab_size, model.config.eos_token_id, model.config.pad_token_id
    trajectories, advantages = [], []
    for p in range(prompts):
        prompt = [model.config.bos_token_id] + torch.randint(3, vocab, (6,), generator=gen).tolist()
        zero = float(torch.rand((), generator=gen)) < zero_share
        for s in range(group):
            length = int(torch.randint(5, 16, (), generator=gen))
            response = torch.randint(3, vocab, (length,), generator=gen).tolist() + [eos]
            trajectories.append(Trajectory(p, s, prompt, response, torch.zeros(len(response)), FinishReason.EOS,
                                           weight_version=0))
            advantages.append(0.0 if zero else float(torch.randn((), generator=gen)))
    batch = build_batch(trajectories, torch.tensor(advantages), pad, with_routing=False)
    with torch.no_grad(), RoutingRecorder(model) as recorder:
        logits = model(input_ids=batch.input_ids, use_cache=False).logits
    batch.routing = recorder.indices()
    batch.rollout_logprobs = torch.where(batch.response_mask, logprobs_from_logits(logits, batch.targets, 0.8), 0.0)
    return batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection

    from repro.model.warmstart_io import ensure_warm_checkpoint
    from repro.model.hf_folder import load_checkpoint
    from repro.recipes import load_recipe
    from repro.train.embedded import EmbeddedTrainer
    from repro.train.grpo_update import TrainerSettings

    model, _ = load_checkpoint(ensure_warm_checkpoint())
    batch = trainer_batch(model)
    settings = TrainerSettings.from_recipe(load_recipe("tiny-cpu"))
    sides = {}
    for label, threads, entrywise in (("library hyper-connections, 1 thread", 1, False),
                                      ("entrywise hyper-connections, 1 thread", 1, True),
                                      ("entrywise hyper-connections, 2 threads", 2, True)):
        trainer = EmbeddedTrainer(copy.deepcopy(model), settings, update_threads=threads)
        if not entrywise:
            for replica in trainer.replicas.models:
                for module in replica.modules():
                    if isinstance(module, DeepseekV4HyperConnection):
                        module.__class__ = DeepseekV4HyperConnection
        sides[label] = (trainer, [])
    load_before = os.getloadavg()[0]
    for repeat in range(args.repeats + 1):
        for trainer, seconds in sides.values():
            start = time.perf_counter()
            trainer.scored_train_step(batch)
            if repeat:  # the first round warms allocator and caches up
                seconds.append(time.perf_counter() - start)
    rows = int((batch.advantages != 0).sum())
    print(f"batch {tuple(batch.input_ids.shape)}, {rows} rows forwarded with gradients, {batch.num_rows - rows} scored "
          f"without; {args.repeats} interleaved repeats; load {load_before:.2f} -> {os.getloadavg()[0]:.2f}")
    base = statistics.median(next(iter(sides.values()))[1])
    for label, (_, seconds) in sides.items():
        median = statistics.median(seconds)
        print(f"{label:42s} {median:7.3f} s  ({base / median:.2f}x)  min {min(seconds):.3f} max {max(seconds):.3f}")


if __name__ == "__main__":
    main()
