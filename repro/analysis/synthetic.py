"""A synthetic, seeded run dir shaped like a real one: for tests, benchmarks and trying the figures.

The curves follow AMD's published shape (reward accuracy ~45 -> 59%, held-out avg@8 30 -> 49%, rollout
throughput ~315 drifting to ~309 tok/s, KL ~0.47 and ESS ~79% near the end) with step-to-step noise, so the
comparison lands near AMD by construction. It is test data, never a result.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from repro import metric_keys as K
from repro.run.metrics_log import MetricsLog
from repro.recipes import dump_recipe, load_recipe


def _ramp(start: float, end: float, steps: int) -> np.ndarray:
    return np.linspace(start, end, steps) if steps > 1 else np.array([end])


def _train_rows(rng: np.random.Generator, steps: int, trajectories: int, group: int) -> list[dict]:
    accuracy = np.clip(_ramp(0.42, 0.62, steps) + rng.normal(0, 0.08, steps), 0.0, 1.0)
    accuracy = np.round(accuracy * trajectories) / trajectories  # a step's accuracy is k / trajectories
    lengths = np.clip(rng.normal(11.5, 0.6, steps), 8, 16)
    throughput = _ramp(316.0, 308.0, steps) + rng.normal(0, 8.0, steps)
    kl = np.abs(_ramp(0.30, 0.47, steps) + rng.normal(0, 0.03, steps))
    ess = np.clip(_ramp(0.86, 0.79, steps) + rng.normal(0, 0.015, steps), 0.05, 1.0)
    rows = []
    for i in range(steps):
        generated = int(round(lengths[i] * trajectories))
        timing = {"rollout": generated / throughput[i], "reward": 0.02 + rng.random() * 0.01,
                  "old_logprob": 0.4 + rng.random() * 0.1, "update": 1.2 + rng.random() * 0.3,
                  "sync": 0.15 + rng.random() * 0.05}
        rows.append({
            "kind": "train", "step": i + 1, "reward/accuracy": float(accuracy[i]),
            "critic/score/mean": float(2 * accuracy[i] - 1),
            "grpo/zero_variance_groups": int(rng.integers(0, trajectories // group // 3 + 1)),
            "response_length/mean": float(lengths[i]), "response_length/max": 16,
            "response_length/clip_ratio": float(rng.random() * 0.02),
            "perf/rollout_tokens_per_s": float(throughput[i]), "perf/generated_tokens": generated,
            "rollout_corr/kl": float(kl[i]), "rollout_corr/k3_kl": float(kl[i] * 0.9),
            "rollout_corr/rollout_is_mean": float(1.0 + rng.normal(0, 0.01)),
            "rollout_corr/rollout_is_eff_sample_size": float(ess[i]),
            "rollout_corr/rollout_is_ratio_fraction_high": float(rng.random() * 0.05),
            K.LOSS: float(rng.normal(0, 0.02)), K.GRAD_NORM: float(abs(rng.normal(0.5, 0.1))),
            K.ENTROPY: float(abs(rng.normal(0.6, 0.05))), K.PG_CLIPFRAC: float(rng.random() * 0.01),
            K.PPO_KL: float(abs(rng.normal(0, 1e-4))), K.LR: 1.0e-4,
            "weight_sync/gbps": float(0.5 + rng.random() * 0.1), "weight_sync/seconds": timing["sync"],
            "weight_sync/bytes": 9_000_000, "weight_sync/buckets": 9, "weight_sync/version": i + 1,
            **{f"timing_s/{phase}": float(s) for phase, s in timing.items()},
            "timing_s/step": float(sum(timing.values()) + 0.01),
        })
    return rows


def _eval_row(rng: np.random.Generator, step: int, steps: int, difficulty: np.ndarray, samples: int) -> dict:
    # Per-problem solve rate: the run's overall level (30% -> 49%) shifted by each problem's fixed difficulty.
    level = 0.30 + (0.492 - 0.30) * step / max(steps, 1)
    logit = np.log(level / (1 - level)) + difficulty
    counts = rng.binomial(samples, 1 / (1 + np.exp(-logit))).astype(int).tolist()
    return {"kind": "eval", "step": step, f"eval/avg@{samples}": sum(counts) / (samples * len(counts)),
            "eval/correct_counts": counts, "eval/num_problems": len(counts), "eval/samples_per_problem": samples,
            "timing_s/eval": float(3.0 + rng.random())}


def write_synthetic_run(run_dir: str | Path, steps: int = 75, seed: int = 0, recipe: str = "tiny-cpu",
                        eval_every: int = 25, num_problems: int = 30) -> Path:
    """Write recipe.yaml and metrics.jsonl (rows in the order a run appends them) into ``run_dir``."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = load_recipe(recipe, [f"steps={steps}", f"eval.every_steps={eval_every}"])
    dump_recipe(resolved, run_dir / "recipe.yaml")
    rng = np.random.default_rng(seed)
    samples = resolved.eval.samples_per_problem
    difficulty = rng.normal(0, 1.0, num_problems)
    train = _train_rows(rng, steps, resolved.trajectories_per_step, resolved.algorithm.responses_per_prompt)
    path = run_dir / "metrics.jsonl"
    path.unlink(missing_ok=True)
    lines = []
    if resolved.eval.at_start:
        lines.append(_eval_row(rng, 0, steps, difficulty, samples))
    for row in train:
        lines.append(row)
        if row["step"] % eval_every == 0 or row["step"] == steps:
            lines.append(_eval_row(rng, row["step"], steps, difficulty, samples))
    log = MetricsLog(path)
    for row in lines:
        log.append(row)
    return run_dir
