"""Training-inference mismatch by source, on one fixed GRPO batch: what each of vLLM's FP8 numerics adds.

    python benchmarks/fp8_mismatch.py [--recipe tiny-cpu] [--model-dir DIR] [--prompts 32] [--n 8] [--seeds 0 1]
                                      [--out FILE.json]

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

The measurement is ``repro.studies.mismatch_sources`` (notebook 15 shows it with the mismatch by position too);
this script prints its summary as markdown.
"""

from __future__ import annotations

import argparse
import json
import time

from repro.studies.mismatch_sources import CONFIGS, R3_SETTINGS, measure_seeds


def markdown(rows: list[dict]) -> str:
    head = ("| source (cumulative) | R3 | k1 KL | k3 KL | ESS | max w | > cap | routing differs |\n"
            "|---|---|---|---|---|---|---|---|")
    lines = [head]
    for row in rows:
        seeds = row["seed"] if isinstance(row["seed"], str) else f"seed {row['seed']}"
        for r3, _ in R3_SETTINGS:
            key = f"r3_{r3}/"
            lines.append(
                f"| {row['config']} ({seeds}) | {r3} | {row[key + 'k1']:.2e} | {row[key + 'k3']:.2e} | "
                f"{100 * row[key + 'ess']:.2f}% | {row[key + 'max_w']:.3f} | {100 * row[key + 'above_cap']:.3f}% | "
                f"{100 * row['routing_flip']:.2f}% |")
    return "\n".join(lines)


def seed_means(rows: list[dict]) -> list[dict]:
    """Per configuration, the mean of every number over the seeds (``seed`` becomes the seed count)."""
    means = []
    for config in CONFIGS:
        group = [r for r in rows if r["config"] == config.label]
        mean = {k: sum(r[k] for r in group) / len(group) for k in group[0] if k not in ("config", "seed")}
        means.append({**mean, "config": config.label, "seed": f"mean of {len(group)}"})
    return means


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="tiny-cpu",
                        help="recipe whose prompts, lengths, temperature and cap are used")
    parser.add_argument("--model-dir", default=None, help="checkpoint folder (default: the recipe's model.path)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", default=None, help="also write the rows as JSON here")
    parser.add_argument("--table-from", default=None,
                        help="print the tables of a JSON written by --out, measure nothing")
    args = parser.parse_args()
    if args.table_from:
        with open(args.table_from) as f:
            rows = json.load(f)
        print(markdown(rows) + "\n\n" + markdown(seed_means(rows)))
        return
    started = time.perf_counter()
    study = measure_seeds(args.recipe, args.prompts, args.n, args.seeds, model_dir=args.model_dir)
    for seed, gap in zip(args.seeds, study["decode_gap"]):
        print(f"seed {seed}: decode vs rescore log-prob gap (all numerics on) max |d| = {gap:.2e}")
    rows = study["summary"]
    print(markdown(rows))
    if len(args.seeds) > 1:
        print(markdown(seed_means(rows)))
    print(f"{time.perf_counter() - started:.1f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
