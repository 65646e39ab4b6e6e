"""Training-inference mismatch by source, on one fixed GRPO batch: what each of vLLM's FP8 numerics adds.

    python benchmarks/fp8_mismatch.py [--model-dir DIR] [--prompts 32] [--n 8] [--seeds 0 1] [--out FILE.json]

One batch of tiny-math responses (32 prompts x 8 at T=0.8) is sampled once per seed by the embedded engine with
every rollout numeric on. Each configuration then rescores those same tokens on its own rollout copy -- weights
synced from the trainer exactly as the run syncs them (``named_weights`` -> ``update_weights`` -> block FP8) and
the numerics of ``repro.rollout.numerics`` switched on cumulatively:

  weights only       block-FP8 weights, fp32 everything else            (the suite before issue 18)
  + W8A8             + activations quantised per token per 128 channels before every FP8 linear
  + BF16 act.        + BF16 GEMM outputs and BF16 streams between layers
  + FP8 KV cache     + DeepSeek-V4's fp8_ds_mla cache (e4m3 NoPE, UE8M0 scales, BF16 RoPE)
  + BF16 trainer     the same rollout, and the trainer computing in BF16 (fp32 masters)    (AMD's setup)

The rescoring is one forward over prompt + response through a wrapped ``DynamicCache`` (every entry is written,
then read back, through the FP8 cache as in decoding). The trainer then recomputes log pi_old with the rollout's
recorded experts replayed (R3) and with its own routing; the table gives k1 and k3 KL, ESS, the largest token
importance weight, the share of tokens above the 2.0 cap, and the share of top-k routing decisions (response
positions x top-k layers) where the trainer's own router picks another expert set than the rollout's.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import torch
from transformers import DynamicCache

from repro.algos import logprobs_from_logits, rollout_corr_metrics
from repro.data.tinymath import TINY_PROMPT_TEMPLATE, train_problems
from repro.model.hf_folder import load_checkpoint
from repro.model.routing import RoutingRecorder
from repro.model.tokenizer import encode_strict
from repro.recipes import resolve_path
from repro.rollout.embedded import EmbeddedEngine
from repro.rollout.fp8_view import FP8WeightView
from repro.rollout.numerics import RolloutNumerics
from repro.rollout.types import SamplingParams
from repro.train.batch import build_batch
from repro.train.embedded import EmbeddedTrainer

TEMPERATURE = 0.8
CAP = 2.0
ALL_ON = RolloutNumerics(activation_quant=True, bf16_activations=True, kv_cache_fp8=True)
CONFIGS = (  # label, rollout numerics, trainer dtype
    ("weights only", RolloutNumerics(), "fp32"),
    ("+ W8A8", RolloutNumerics(activation_quant=True), "fp32"),
    ("+ BF16 act.", RolloutNumerics(activation_quant=True, bf16_activations=True), "fp32"),
    ("+ FP8 KV cache", ALL_ON, "fp32"),
    ("+ BF16 trainer", ALL_ON, "bf16"),
)
KEYS = (("k1", "kl"), ("k3", "k3_kl"), ("ess", "rollout_is_eff_sample_size"), ("max_w", "rollout_is_max"),
        ("above_cap", "rollout_is_ratio_fraction_high"))


def rollout_engine(model, tokenizer, trainer: EmbeddedTrainer, numerics: RolloutNumerics) -> EmbeddedEngine:
    """An engine over an fp32 copy of ``model`` serving the trainer's weights through block FP8."""
    engine = EmbeddedEngine(model, tokenizer.eos_token_id, tokenizer.pad_token_id, 64, FP8WeightView(),
                            numerics=replace(numerics, hooked=[]))
    engine.update_weights(trainer.named_weights(), version=1)
    return engine


@torch.no_grad()
def rescore(engine: EmbeddedEngine, batch) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """[B, T] log-probs of the batch's targets under the engine's numerics, and its routing [B, T, k] per layer."""
    model = engine.model
    cache = engine.numerics.wrap_cache(DynamicCache(config=model.config), model.config)
    with RoutingRecorder(model) as recorder:
        logits = model(input_ids=batch.input_ids, use_cache=True, **{engine._cache_argument: cache}).logits
    logprobs = logprobs_from_logits(logits.float(), batch.targets, TEMPERATURE)
    return torch.where(batch.response_mask, logprobs, 0.0), recorder.indices()


@torch.no_grad()
def routing_flips(trainer: EmbeddedTrainer, batch) -> float:
    """Share of (response position, top-k layer) pairs where the trainer's own router picks other experts."""
    with RoutingRecorder(trainer.model) as recorder:
        trainer.model(input_ids=batch.input_ids, use_cache=False)
    own = recorder.indices()
    flips = [(own[k].sort(-1).values != batch.routing[k].sort(-1).values).any(-1)[batch.response_mask]
             for k in batch.routing]
    return float(torch.cat(flips).float().mean())


def sample_fixed_batch(model, tokenizer, trainer, prompts, n: int, seed: int):
    """The batch every configuration rescores, sampled with all numerics on; also its decode-time log-probs."""
    engine = rollout_engine(model, tokenizer, trainer, ALL_ON)
    result = engine.generate(prompts, SamplingParams(n=n, temperature=TEMPERATURE, max_new_tokens=16, seed=seed))
    batch = build_batch(result.trajectories, torch.zeros(len(result.trajectories)), tokenizer.pad_token_id,
                        with_routing=False)
    decoded = torch.zeros(batch.input_ids.shape)
    for row, traj in enumerate(result.trajectories):
        start = len(traj.prompt_ids) - 1
        decoded[row, start : start + len(traj.response_ids)] = traj.logprobs
    rescored, _ = rescore(engine, batch)
    # decoding token by token and rescoring in one forward use the same numerics; fp32 matmul order differs, and
    # an FP8 rounding boundary turns that ~1e-6 into a flipped activation now and then (measured max 6e-3 with
    # W8A8 alone, 3e-2 with everything on; 3e-6 with the numerics off)
    gap = float((decoded - rescored)[batch.response_mask].abs().max())
    return batch, gap


def measure(model_dir, prompts_n: int, n: int, seed: int) -> tuple[list[dict], float]:
    model, tokenizer = load_checkpoint(model_dir)
    trainers = {dtype: EmbeddedTrainer(model_dir, temperature=TEMPERATURE, dtype=dtype) for dtype in ("fp32", "bf16")}
    problems = train_problems(seed=seed, n=prompts_n)
    prompts = [encode_strict(tokenizer, TINY_PROMPT_TEMPLATE.format(problem=p.problem)) for p in problems]
    batch, decode_gap = sample_fixed_batch(model, tokenizer, trainers["fp32"], prompts, n, seed)
    rows = []
    for label, numerics, dtype in CONFIGS:
        trainer = trainers[dtype]
        batch.rollout_logprobs, batch.routing = rescore(rollout_engine(model, tokenizer, trainer, numerics), batch)
        row = {"config": label, "seed": seed, "tokens": int(batch.response_mask.sum())}
        for r3, replay in (("r3", True), ("no_r3", False)):
            old = trainer.logprobs(batch, replay_routing=replay).logprobs
            metrics = rollout_corr_metrics(old, batch.rollout_logprobs, batch.response_mask, "token", CAP)
            row.update({f"{r3}/{short}": metrics[f"rollout_corr/{key}"] for short, key in KEYS})
        row["routing_flip"] = routing_flips(trainer, batch)
        rows.append(row)
    return rows, decode_gap


def markdown(rows: list[dict]) -> str:
    head = ("| source (cumulative) | R3 | k1 KL | k3 KL | ESS | max w | > 2.0 cap | routing differs |\n"
            "|---|---|---|---|---|---|---|---|")
    lines = [head]
    for row in rows:
        seeds = row["seed"] if isinstance(row["seed"], str) else f"seed {row['seed']}"
        for r3 in ("r3", "no_r3"):
            lines.append(
                f"| {row['config']} ({seeds}) | {'on' if r3 == 'r3' else 'off'} | {row[f'{r3}/k1']:.2e} | "
                f"{row[f'{r3}/k3']:.2e} | {100 * row[f'{r3}/ess']:.2f}% | {row[f'{r3}/max_w']:.3f} | "
                f"{100 * row[f'{r3}/above_cap']:.3f}% | {100 * row['routing_flip']:.2f}% |")
    return "\n".join(lines)


def seed_means(rows: list[dict]) -> list[dict]:
    """Per configuration, the mean of every number over the seeds (``seed`` becomes the seed count)."""
    means = []
    for label, _, _ in CONFIGS:
        group = [r for r in rows if r["config"] == label]
        mean = {k: sum(r[k] for r in group) / len(group) for k in group[0] if k not in ("config", "seed")}
        means.append({**mean, "config": label, "seed": f"mean of {len(group)}"})
    return means


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default="builtin:tiny-dsv4-warm")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", default=None, help="also write the rows as JSON here")
    parser.add_argument("--table-from", default=None, help="print the tables of a JSON written by --out, measure nothing")
    args = parser.parse_args()
    if args.table_from:
        with open(args.table_from) as f:
            rows = json.load(f)
        print(markdown(rows) + "\n\n" + markdown(seed_means(rows)))
        return
    torch.set_num_threads(1)
    started = time.perf_counter()
    rows = []
    for seed in args.seeds:
        seed_rows, gap = measure(resolve_path(args.model_dir), args.prompts, args.n, seed)
        print(f"seed {seed}: decode vs rescore log-prob gap (all numerics on) max |d| = {gap:.2e}")
        rows += seed_rows
    print(markdown(rows))
    if len(args.seeds) > 1:
        print(markdown(seed_means(rows)))
    print(f"{time.perf_counter() - started:.1f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
