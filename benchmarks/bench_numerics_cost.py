"""What the vLLM-like rollout numerics and the BF16 trainer cost per step, as interleaved A/B ratios.

    python benchmarks/bench_numerics_cost.py [--repeats 5] [--prompts 32] [--n 8]

Rollout: one step's generate (32 prompts x 8, T=0.8, 16 new tokens) on the shipped tiny model, numerics off
(block-FP8 weights only) and all on (W8A8 + BF16 activations + FP8 KV cache), alternating A, B, A, B ... so a
change of machine load hits both. Trainer: one ``logprobs`` pass plus one ``train_step`` on that batch, fp32 vs
bf16 (fp32 masters), alternating likewise. Prints per-repeat seconds and the median ratio B / A of each.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from repro.data.tinymath import TINY_PROMPT_TEMPLATE, train_problems
from repro.model.hf_folder import load_checkpoint
from repro.model.tokenizer import encode_strict
from repro.recipes import resolve_path
from repro.rollout.embedded import EmbeddedEngine
from repro.rollout.fp8_view import FP8WeightView
from repro.rollout.numerics import RolloutNumerics
from repro.rollout.types import SamplingParams
from repro.train.batch import build_batch
from repro.train.embedded import EmbeddedTrainer
from repro.train.grpo_update import TrainerSettings


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model_dir = resolve_path("builtin:tiny-dsv4-warm")
    model, tokenizer = load_checkpoint(model_dir)
    prompts = [encode_strict(tokenizer, TINY_PROMPT_TEMPLATE.format(problem=p.problem))
               for p in train_problems(seed=0, n=args.prompts)]
    params = SamplingParams(n=args.n, temperature=0.8, max_new_tokens=16, seed=0)
    engines = {label: EmbeddedEngine(model, tokenizer.eos_token_id, tokenizer.pad_token_id, 64, FP8WeightView(),
                                     numerics=numerics)
               for label, numerics in (("off", RolloutNumerics()),
                                       ("on", RolloutNumerics(activation_quant=True, bf16_activations=True,
                                                              kv_cache_fp8=True)))}
    result = engines["off"].generate(prompts, params)
    advantages = torch.randn(len(result.trajectories), generator=torch.Generator().manual_seed(0))
    batch = build_batch(result.trajectories, advantages, tokenizer.pad_token_id)
    batch.rollout_logprobs = torch.zeros(batch.input_ids.shape)
    trainers = {dtype: EmbeddedTrainer(model_dir, TrainerSettings(dtype=dtype, max_tokens_per_micro_batch=16384,
                                                                  temperature=0.8)) for dtype in ("fp32", "bf16")}

    def train(trainer):
        batch.old_logprobs = trainer.logprobs(batch).logprobs
        trainer.train_step(batch)

    seconds = {key: [] for key in ("off", "on", "fp32", "bf16")}
    for label in engines:  # warm-up, not counted
        engines[label].generate(prompts, params)
    for repeat in range(args.repeats):
        for label in ("off", "on"):
            seconds[label].append(timed(lambda: engines[label].generate(prompts, params)))
        for dtype in ("fp32", "bf16"):
            seconds[dtype].append(timed(lambda: train(trainers[dtype])))
        print(f"repeat {repeat}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in seconds.items()), flush=True)
    for a, b, what in (("off", "on", "rollout generate, numerics all on / off"),
                       ("fp32", "bf16", "trainer logprobs + train_step, bf16 / fp32")):
        ratios = [y / x for x, y in zip(seconds[a], seconds[b])]
        print(f"{what}: median {statistics.median(seconds[a]):.2f} s -> {statistics.median(seconds[b]):.2f} s, "
              f"median ratio {statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
