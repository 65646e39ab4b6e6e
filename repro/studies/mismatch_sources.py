"""Training-inference mismatch by numeric source and by response position, on one fixed GRPO batch of a recipe.

Notebook 15 and ``benchmarks/fp8_mismatch.py`` ask the same question: which of the rollout's numerics makes its
token distribution differ from the trainer's, and by how much. One batch of the recipe's training prompts
(``prompts`` x ``n`` at the recipe's temperature) is sampled once per seed by the embedded engine with every
rollout numeric on. Each configuration of ``CONFIGS`` then rescores those same tokens on its own rollout copy,
weights synced from the trainer as the run syncs them (``named_weights`` -> ``update_weights`` -> block FP8), with
the numerics of ``repro.rollout.numerics`` switched on cumulatively; the last row also makes the trainer compute in
BF16 (AMD's setup). The trainer recomputes log pi_old with the rollout's experts replayed (R3) and with its own
routing. Per configuration and R3 setting: k1 and k3 KL, ESS, the largest token weight, the share above the TIS cap
(``repro.algos.rollout_corr_metrics``, LumenRL's definitions), the share of routing decisions where the trainer's
router picks other experts, and the same k1 / k3 / |delta| by response position, in LumenRL's buckets
(``repro.algos.metrics.position_metrics``) and in finer ones of ``bucket_width`` tokens (a 160-token response lies
inside LumenRL's first two buckets).

The rescoring is one forward over prompt + response through a wrapped ``DynamicCache`` (every entry is written,
then read back, through the FP8 cache as in decoding). The engine is repro's embedded one on CPU: on a cluster
recipe this measures the emulation of vLLM's numerics on that recipe's (small enough) model, not vLLM itself.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from transformers import DynamicCache

from repro.algos import logprobs_from_logits, rollout_corr_metrics
from repro.algos.metrics import position_metrics
from repro.data.recipe_datasets import load_dataset, recipe_prompt_ids
from repro.metric_keys import position_buckets, position_key
from repro.model.hf_folder import load_checkpoint
from repro.model.routing import RoutingRecorder
from repro.recipes import load_recipe, resolve_path
from repro.recipes.schema import Recipe
from repro.rollout.embedded import EmbeddedEngine
from repro.rollout.fp8_view import FP8WeightView
from repro.rollout.numerics import RolloutNumerics
from repro.rollout.types import SamplingParams
from repro.train.batch import TrainBatch, build_batch
from repro.train.embedded import EmbeddedTrainer
from repro.train.grpo_update import TrainerSettings

ALL_ON = RolloutNumerics(activation_quant=True, bf16_activations=True, kv_cache_fp8=True)


@dataclass(frozen=True)
class SourceConfig:
    label: str
    numerics: RolloutNumerics
    trainer_dtype: str


CONFIGS: tuple[SourceConfig, ...] = (  # cumulative, in the order the sources were added to the emulation
    SourceConfig("weights only", RolloutNumerics(), "fp32"),
    SourceConfig("+ W8A8", RolloutNumerics(activation_quant=True), "fp32"),
    SourceConfig("+ BF16 act.", RolloutNumerics(activation_quant=True, bf16_activations=True), "fp32"),
    SourceConfig("+ FP8 KV cache", ALL_ON, "fp32"),
    SourceConfig("+ BF16 trainer", ALL_ON, "bf16"),
)
# short name in the tables -> rollout_corr/ key of repro.algos.rollout_corr_metrics
SUMMARY_KEYS = (("k1", "kl"), ("k3", "k3_kl"), ("ess", "rollout_is_eff_sample_size"), ("max_w", "rollout_is_max"),
                ("above_cap", "rollout_is_ratio_fraction_high"))
R3_SETTINGS = (("on", True), ("off", False))


@dataclass
class FixedBatch:
    """The sampled batch every configuration rescores, and what the study was run with."""

    batch: TrainBatch
    decode_gap: float  # max |decode-time - rescored| log-prob with everything on: the rescoring's own error
    recipe: str
    seed: int


def rollout_engine(model, tokenizer, trainer: EmbeddedTrainer, numerics: RolloutNumerics,
                   max_context: int) -> EmbeddedEngine:
    """An engine over an fp32 copy of ``model`` serving the trainer's weights through block FP8."""
    engine = EmbeddedEngine(model, tokenizer.eos_token_id, tokenizer.pad_token_id, max_context, FP8WeightView(),
                            numerics=replace(numerics, hooked=[]))
    engine.update_weights(trainer.named_weights(), version=1)
    return engine


@torch.no_grad()
def rescore(engine: EmbeddedEngine, batch: TrainBatch, temperature: float):
    """[B, T] log-probs of the batch's targets under the engine's numerics (0 off-response), and its routing
    {layer: [B, T, k]}."""
    model = engine.model
    cache = engine.numerics.wrap_cache(DynamicCache(config=model.config), model.config)
    with RoutingRecorder(model) as recorder:
        logits = model(input_ids=batch.input_ids, use_cache=True, **{engine._cache_argument: cache}).logits
    logprobs = logprobs_from_logits(logits.float(), batch.targets, temperature)
    return torch.where(batch.response_mask, logprobs, 0.0), recorder.indices()


@torch.no_grad()
def routing_flips(trainer: EmbeddedTrainer, batch: TrainBatch) -> float:
    """Share of (response position, top-k layer) pairs where the trainer's own router picks other experts."""
    with RoutingRecorder(trainer.model) as recorder:
        trainer.model(input_ids=batch.input_ids, use_cache=False)
    own = recorder.indices()
    flips = [(own[k].sort(-1).values != batch.routing[k].sort(-1).values).any(-1)[batch.response_mask]
             for k in batch.routing]
    return float(torch.cat(flips).float().mean())


def recipe_prompts(recipe: Recipe, tokenizer, count: int, seed: int) -> list[list[int]]:
    """Token ids of the first ``count`` training prompts of ``recipe`` in its seeded order."""
    with tempfile.TemporaryDirectory(prefix="repro-sources-") as data_dir:
        problems = load_dataset(recipe.data.train, data_dir, seed=seed)[:count]
    if len(problems) < count:
        raise ValueError(f"recipe {recipe.name!r}: {len(problems)} training problems, the study asks for {count}")
    return recipe_prompt_ids(tokenizer, problems, recipe, "train")


def sample_fixed_batch(recipe: Recipe, model, tokenizer, trainer: EmbeddedTrainer, prompts: int, n: int,
                       seed: int) -> FixedBatch:
    """Sample the batch with every numeric on, and measure how far one-forward rescoring is from decoding."""
    temperature = recipe.rollout.temperature
    engine = rollout_engine(model, tokenizer, trainer, ALL_ON, recipe.lengths.max_context)
    params = SamplingParams(n=n, temperature=temperature, max_new_tokens=recipe.lengths.max_response, seed=seed)
    result = engine.generate(recipe_prompts(recipe, tokenizer, prompts, seed), params)
    batch = build_batch(result.trajectories, torch.zeros(len(result.trajectories)), tokenizer.pad_token_id,
                        with_routing=False)
    decoded = torch.zeros(batch.input_ids.shape)
    for row, traj in enumerate(result.trajectories):
        start = len(traj.prompt_ids) - 1
        decoded[row, start : start + len(traj.response_ids)] = traj.logprobs
    rescored, _ = rescore(engine, batch, temperature)
    # decoding token by token and rescoring in one forward share the numerics; fp32 matmul order differs, and an FP8
    # rounding boundary turns that ~1e-6 into a flipped activation now and then (tiny-cpu: max ~3e-2 all on)
    gap = float((decoded - rescored)[batch.response_mask].abs().max())
    return FixedBatch(batch, gap, recipe.name, seed)


def bucket_stats(logp_old: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor,
                 edges: tuple[int, ...]) -> list[dict]:
    """k1 / k3 / |delta| / tokens of the valid tokens whose 0-based response position is in [start, end), for the
    buckets [0, e0), [e0, e1), ...; inputs [B, T]. The statistics of ``position_metrics`` (LumenRL's, k3 clamped at
    10) for any edges; empty buckets are left out."""
    valid = mask.bool()
    positions = valid.long().cumsum(dim=-1) - 1
    delta = logp_rollout.double() - logp_old.double()
    k3 = torch.exp((-delta).clamp(-10.0, 10.0)) + delta - 1.0
    rows = []
    for start, end in zip((0,) + tuple(edges[:-1]), edges):
        selected = valid & (positions >= start) & (positions < end)
        if selected.any():
            rows.append({"start": start, "end": end, "tokens": int(selected.sum()), "k1": float(delta[selected].mean()),
                         "k3": float(k3[selected].mean()), "abs_diff": float(delta[selected].abs().mean())})
    return rows


def measure_sources(recipe: str | Recipe, prompts: int = 32, n: int = 8, seed: int = 0, bucket_width: int = 32,
                    model_dir: str | Path | None = None) -> dict:
    """The study on one seed: ``{"summary": rows, "positions": rows, "lumenrl_buckets": rows, "decode_gap": x}``.

    summary: one row per configuration (``config``, ``seed``, ``tokens``, ``routing_flip``, and ``r3_on/k1``,
    ``r3_off/k1``, ... for each of SUMMARY_KEYS); positions: one row per configuration, R3 setting and
    ``bucket_width``-token bucket; lumenrl_buckets: the same with LumenRL's edges and ``rollout_corr/pos_*`` keys.
    """
    recipe = load_recipe(recipe) if isinstance(recipe, str) else recipe
    if bucket_width < 1:
        raise ValueError(f"bucket_width must be >= 1, got {bucket_width}")
    folder = resolve_path(recipe.model.path) if model_dir is None else Path(model_dir)
    temperature, cap = recipe.rollout.temperature, recipe.rollout_correction.threshold
    model, tokenizer = load_checkpoint(folder)
    trainers = {dtype: EmbeddedTrainer(folder, TrainerSettings(dtype=dtype, max_tokens_per_micro_batch=16384,
                                                               temperature=temperature)) for dtype in ("fp32", "bf16")}
    fixed = sample_fixed_batch(recipe, model, tokenizer, trainers["fp32"], prompts, n, seed)
    batch = fixed.batch
    edges = tuple(range(bucket_width, recipe.lengths.max_response + bucket_width, bucket_width))
    summary, positions, lumenrl = [], [], []
    for config in CONFIGS:
        trainer = trainers[config.trainer_dtype]
        engine = rollout_engine(model, tokenizer, trainer, config.numerics, recipe.lengths.max_context)
        batch.rollout_logprobs, batch.routing = rescore(engine, batch, temperature)
        row = {"config": config.label, "seed": seed, "tokens": int(batch.response_mask.sum())}
        for r3, replay in R3_SETTINGS:
            old = trainer.logprobs(batch, replay_routing=replay).logprobs
            metrics = rollout_corr_metrics(old, batch.rollout_logprobs, batch.response_mask, "token", cap)
            row.update({f"r3_{r3}/{short}": metrics[f"rollout_corr/{key}"] for short, key in SUMMARY_KEYS})
            for bucket in bucket_stats(old, batch.rollout_logprobs, batch.response_mask, edges):
                positions.append({"config": config.label, "seed": seed, "r3": r3, **bucket})
            by_key = position_metrics(old, batch.rollout_logprobs, batch.response_mask)
            for start, end in position_buckets():
                if position_key(start, end, "tokens") in by_key:
                    lumenrl.append({"config": config.label, "seed": seed, "r3": r3, "bucket": f"{start}-{end - 1}",
                                    **{stat: by_key[position_key(start, end, stat)]
                                       for stat in ("tokens", "kl", "k3_kl", "abs_diff")}})
        row["routing_flip"] = routing_flips(trainer, batch)
        summary.append(row)
    return {"summary": summary, "positions": positions, "lumenrl_buckets": lumenrl, "decode_gap": fixed.decode_gap}


def measure_seeds(recipe: str | Recipe, prompts: int, n: int, seeds: list[int], bucket_width: int = 32,
                  model_dir: str | Path | None = None) -> dict:
    """``measure_sources`` for every seed, the rows concatenated (``decode_gap``: one per seed). torch runs on one
    thread meanwhile: another thread count sums in another order, and the FP8 roundings turn that into different
    numbers, so the notebook's kernel and a test's process would not agree bit for bit."""
    return over_seeds(lambda seed: measure_sources(recipe, prompts, n, seed, bucket_width, model_dir), seeds)


def checked_seeds(seeds, name: str = "seeds") -> list[int]:
    """``seeds`` as a non-empty list of ints, or a ValueError naming the parameter (papermill's ``-p`` hands a
    list over as its text: ``-y 'seeds: [0, 1]'`` passes a list)."""
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, (list, tuple)) or not seeds \
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ValueError(f"{name}: expected a non-empty list of integer seeds, got {seeds!r}")
    return list(seeds)


def over_seeds(measure, seeds: list[int]) -> dict:
    """``measure(seed)`` for every seed on one torch thread, its ``summary`` / ``positions`` / ``lumenrl_buckets``
    rows concatenated and its ``decode_gap`` listed, one per seed."""
    seeds = checked_seeds(seeds)
    out = {"summary": [], "positions": [], "lumenrl_buckets": [], "decode_gap": []}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for seed in seeds:
            one = measure(seed)
            for key in ("summary", "positions", "lumenrl_buckets"):
                out[key] += one[key]
            out["decode_gap"].append(one["decode_gap"])
    finally:
        torch.set_num_threads(threads)
    return out


def summary_frame(rows: list[dict]):
    """The summary rows, seeds averaged, one row per configuration and R3 setting (the benchmark's table)."""
    import pandas as pd

    long = []
    for row in rows:
        for r3, _ in R3_SETTINGS:
            long.append({"config": row["config"], "seed": row["seed"], "r3": r3, "routing_flip": row["routing_flip"],
                         **{short: row[f"r3_{r3}/{short}"] for short, _ in SUMMARY_KEYS}})
    frame = pd.DataFrame(long)
    return frame.drop(columns="seed").groupby(["config", "r3"], sort=False).mean().reset_index()


def position_frame(rows: list[dict], stat: str = "k1", r3: str = "on"):
    """One ``stat`` (k1, k3, abs_diff) by bucket start (rows) and configuration (columns), seeds averaged,
    token-weighted within a bucket."""
    import pandas as pd

    frame = pd.DataFrame([r for r in rows if r["r3"] == r3])
    frame["weighted"] = frame[stat] * frame["tokens"]
    grouped = frame.groupby(["start", "config"], sort=False)[["weighted", "tokens"]].sum()
    table = (grouped["weighted"] / grouped["tokens"]).unstack("config")
    return table[[c.label for c in CONFIGS if c.label in table.columns]]
