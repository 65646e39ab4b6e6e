"""Which source carries the growth of the rollout/trainer mismatch with response position (issue 31, item 2).

A run logs the mismatch in LumenRL's position buckets (``rollout_corr/pos_*``: 0-127, 128-511, ...), which a
~160-token tiny-cpu-long answer fills only two of; ``run_position_table`` reads them from run directories. The
attribution works on one fixed batch (``repro.studies.mismatch_sources.sample_fixed_batch``: the recipe's prompts
sampled with every rollout numeric on, from the warm start or a run's checkpoint) and rescores it once per row of
``ATTRIBUTION``, each switching one source off or replaying it, in ``bucket_width``-token buckets:

* the rollout's numerics (W8A8, BF16 activations, the FP8 KV cache): that numeric off in the rescoring;
* the compressed attention's indexer: the trainer forced to keep the entries the rollout's indexer kept
  (``repro.model.indexer_choices``), which removes what the indexer's flipped choices add;
* routing: R3 off, which adds what the router's flips would add (the run replays them, so they add nothing there);
* the trainer's BF16: an fp32 trainer.

Beside k1 / k3 / |delta| each row has, per bucket, the share of (token, CSA layer) pairs where the trainer's own
indexer keeps other entries than the rollout's and the share of (token, top-k layer) pairs where its router picks
other experts. Log-probs are the sampled distribution's on both sides (vLLM's ``processed``), so the rows measure
the numerics alone; ``raw`` adds AMD's convention (rollout log-probs at T = 1, as the runs log them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
from transformers import DynamicCache

from repro.algos import logprobs_from_logits, rollout_corr_metrics
from repro.studies.mismatch_sources import ALL_ON, bucket_stats, over_seeds, rollout_engine, sample_fixed_batch
from repro.metric_keys import POSITION_BUCKET_EDGES
from repro.model.hf_folder import load_checkpoint
from repro.model.indexer_choices import IndexerChoices, choice_disagreement
from repro.model.routing import RoutingRecorder, RoutingReplay
from repro.recipes import load_recipe, resolve_path
from repro.recipes.schema import Recipe
from repro.rollout.numerics import RolloutNumerics
from repro.train.batch import TrainBatch
from repro.train.embedded import EmbeddedTrainer
from repro.train.grpo_update import TrainerSettings

WEIGHTS_ONLY = RolloutNumerics()


@dataclass(frozen=True)
class Attribution:
    label: str
    numerics: RolloutNumerics     # the rollout's numerics in the rescoring
    trainer_dtype: str = "bf16"   # the run's trainer
    r3: bool = True               # the run replays the rollout's experts
    replay_indexer: bool = False  # force the rollout's indexer choices on the trainer
    raw: bool = False             # rollout log-probs at T = 1 (AMD's convention), trainer's at the temperature


ATTRIBUTION: tuple[Attribution, ...] = (
    Attribution("all on (the run)", ALL_ON),
    Attribution("all on, AMD's raw log-probs", ALL_ON, raw=True),
    Attribution("all on, indexer replayed", ALL_ON, replay_indexer=True),
    Attribution("all on, R3 off", ALL_ON, r3=False),
    Attribution("all on, fp32 trainer", ALL_ON, trainer_dtype="fp32"),
    Attribution("all on - W8A8", replace(ALL_ON, activation_quant=False)),
    Attribution("all on - BF16 act.", replace(ALL_ON, bf16_activations=False)),
    Attribution("all on - FP8 KV cache", replace(ALL_ON, kv_cache_fp8=False)),
    Attribution("all on - FP8 KV cache, indexer replayed", replace(ALL_ON, kv_cache_fp8=False), replay_indexer=True),
    Attribution("weights only", WEIGHTS_ONLY),
    Attribution("weights only, indexer replayed", WEIGHTS_ONLY, replay_indexer=True),
    Attribution("weights only + FP8 KV cache", replace(WEIGHTS_ONLY, kv_cache_fp8=True)),
)


def response_positions(mask: torch.Tensor) -> torch.Tensor:
    """[B, T] 0-based position of each valid token among its row's valid tokens (-1 elsewhere)."""
    valid = mask.bool()
    return torch.where(valid, valid.long().cumsum(dim=-1) - 1, -1)


def share_by_bucket(flags: list[torch.Tensor], mask: torch.Tensor, edges: tuple[int, ...]) -> list[dict]:
    """Per bucket [start, end) of response position: the share of True among ``flags`` ([B, T] bool each, e.g.
    one per layer) over the valid tokens in it; empty buckets are left out."""
    positions = response_positions(mask)
    stacked = torch.stack([f.bool() for f in flags]) if flags else torch.zeros((0, *mask.shape), dtype=torch.bool)
    rows = []
    for start, end in zip((0,) + tuple(edges[:-1]), edges):
        selected = (positions >= start) & (positions < end)
        if selected.any() and len(flags):
            rows.append({"start": start, "end": end, "share": float(stacked[:, selected].float().mean())})
    return rows


@torch.no_grad()
def rollout_scores(engine, batch: TrainBatch, temperature: float, raw: bool):
    """The rescoring of ``mismatch_sources.rescore`` that also records the indexer: ([B, T] log-probs at the
    temperature, or at T = 1 when ``raw``; routing {layer: [B, T, k]}; indexer choices {layer: [B, T, k]})."""
    model = engine.model
    cache = engine.numerics.wrap_cache(DynamicCache(config=model.config), model.config)
    with RoutingRecorder(model) as routing, IndexerChoices(model) as chosen:
        logits = model(input_ids=batch.input_ids, use_cache=True, **{engine._cache_argument: cache}).logits
    logprobs = logprobs_from_logits(logits.float(), batch.targets, 1.0 if raw else temperature)
    return torch.where(batch.response_mask, logprobs, 0.0), routing.indices(), chosen.choices


@torch.no_grad()
def trainer_scores(model, batch: TrainBatch, temperature: float, routing: dict | None, indexer: dict | None):
    """One full forward of the trainer's model: ([B, T] log-probs at the temperature, its own routing, its own
    indexer choices); ``routing`` / ``indexer`` given are replayed (the own ones are then the replayed ones)."""
    route = RoutingReplay(model, routing) if routing is not None else RoutingRecorder(model)
    with route, IndexerChoices(model, replay=indexer) as chosen:
        logits = model(input_ids=batch.input_ids, use_cache=False).logits
    own_routing = routing if routing is not None else route.indices()
    own_indexer = indexer if indexer is not None else chosen.choices
    logprobs = logprobs_from_logits(logits.float(), batch.targets, temperature)
    return torch.where(batch.response_mask, logprobs, 0.0), own_routing, own_indexer


def _flags(a: dict, b: dict) -> list[torch.Tensor]:
    """[B, T] per layer: where the two records choose differently (experts or indexer entries)."""
    return [choice_disagreement(a[layer], b[layer])[0] for layer in sorted(a)]


def attribute(recipe: Recipe, folder: Path, prompts: int, n: int, seed: int, bucket_width: int,
              rows: tuple[Attribution, ...] = ATTRIBUTION) -> dict:
    """The attribution on one fixed batch sampled from the checkpoint in ``folder`` (module docstring).

    Returns {"summary": one row per attribution (k1, k3, ESS, abs_diff, tokens, indexer / routing disagreement
    overall), "positions": one row per attribution and ``bucket_width``-token bucket, "lumenrl_buckets": the same
    in LumenRL's edges, "decode_gap": the rescoring's own error}."""
    temperature, cap = recipe.rollout.temperature, recipe.rollout_correction.threshold
    model, tokenizer = load_checkpoint(folder)
    trainers = {dtype: EmbeddedTrainer(folder, TrainerSettings(dtype=dtype, max_tokens_per_micro_batch=16384,
                                                               temperature=temperature)) for dtype in ("fp32", "bf16")}
    fixed = sample_fixed_batch(recipe, model, tokenizer, trainers["fp32"], prompts, n, seed)
    batch, mask = fixed.batch, fixed.batch.response_mask
    fine = tuple(range(bucket_width, recipe.lengths.max_response + bucket_width, bucket_width))
    summary, positions, lumenrl = [], [], []
    engines: dict = {}
    free: dict = {}  # trainer dtype -> its own (routing, indexer choices), the same for every row
    for row in rows:
        key = (row.numerics.activation_quant, row.numerics.bf16_activations, row.numerics.kv_cache_fp8)
        if key not in engines:
            engines[key] = rollout_engine(model, tokenizer, trainers["fp32"], row.numerics, recipe.lengths.max_context)
        rollout, routing, chosen = rollout_scores(engines[key], batch, temperature, row.raw)
        trainer = trainers[row.trainer_dtype].model
        old, own_routing, own_chosen = trainer_scores(trainer, batch, temperature, routing if row.r3 else None,
                                                      chosen if row.replay_indexer else None)
        # disagreement of the trainer's *own* choices with the rollout's, whatever this row replays
        if row.trainer_dtype not in free:
            free[row.trainer_dtype] = trainer_scores(trainer, batch, temperature, None, None)[1:]
        free_routing, free_chosen = free[row.trainer_dtype]
        index_flags, route_flags = _flags(chosen, free_chosen), _flags(routing, free_routing)
        metrics = rollout_corr_metrics(old, rollout, mask, "token", cap)
        valid = mask.bool()
        summary.append({"config": row.label, "seed": seed, "tokens": int(valid.sum()),
                        "k1": metrics["rollout_corr/kl"], "k3": metrics["rollout_corr/k3_kl"],
                        "ess": metrics["rollout_corr/rollout_is_eff_sample_size"],
                        "abs_diff": float((rollout - old).double()[valid].abs().mean()),
                        "indexer_disagree": float(torch.stack(index_flags)[:, valid].float().mean()),
                        "routing_flip": float(torch.stack(route_flags)[:, valid].float().mean())})
        shares = {"indexer_disagree": share_by_bucket(index_flags, mask, fine),
                  "routing_flip": share_by_bucket(route_flags, mask, fine)}
        for i, bucket in enumerate(bucket_stats(old, rollout, mask, fine)):
            extra = {name: rows_[i]["share"] for name, rows_ in shares.items()}
            positions.append({"config": row.label, "seed": seed, **bucket, **extra})
        for bucket in bucket_stats(old, rollout, mask, POSITION_BUCKET_EDGES):
            lumenrl.append({"config": row.label, "seed": seed, "bucket": f"{bucket['start']}-{bucket['end'] - 1}",
                            **{k: bucket[k] for k in ("tokens", "k1", "k3", "abs_diff")}})
    return {"summary": summary, "positions": positions, "lumenrl_buckets": lumenrl, "decode_gap": fixed.decode_gap}


def attribute_seeds(recipe: str | Recipe, prompts: int, n: int, seeds: list[int], bucket_width: int = 32,
                    model_dir: str | Path | None = None) -> dict:
    """``attribute`` for every seed, rows concatenated, on one torch thread (bit-for-bit repeatable, as
    ``mismatch_sources.measure_seeds``)."""
    recipe = load_recipe(recipe) if isinstance(recipe, str) else recipe
    if bucket_width < 1:
        raise ValueError(f"bucket_width must be >= 1, got {bucket_width}")
    folder = resolve_path(recipe.model.path) if not model_dir else Path(model_dir)
    return over_seeds(lambda seed: attribute(recipe, folder, prompts, n, seed, bucket_width), seeds)


def growth(position_rows: list[dict], stat: str = "k3", early: int = 32, late: int = 128) -> dict[str, dict]:
    """Per configuration, token-weighted ``stat`` over positions < ``early`` and >= ``late`` and their ratio: how
    much the mismatch grows from the answer's start to its end."""
    out: dict[str, dict] = {}
    for row in position_rows:
        entry = out.setdefault(row["config"], {"early_w": 0.0, "early_n": 0, "late_w": 0.0, "late_n": 0})
        side = "early" if row["end"] <= early else "late" if row["start"] >= late else None
        if side:
            entry[f"{side}_w"] += row[stat] * row["tokens"]
            entry[f"{side}_n"] += row["tokens"]
    result = {}
    for config, e in out.items():
        first = e["early_w"] / e["early_n"] if e["early_n"] else float("nan")
        last = e["late_w"] / e["late_n"] if e["late_n"] else float("nan")
        result[config] = {"early": first, "late": last, "ratio": last / first if first else float("nan")}
    return result


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def checkpoint_model(run_dir: str | Path, step: int, out_dir: str | Path, tokenizer_from: str | Path) -> Path:
    """A model folder for the trainer weights a run checkpointed at ``step`` (its ``trainer/config.json`` and the
    BF16 ``model.safetensors`` the run syncs to the rollout), with the tokenizer files of ``tokenizer_from`` (the
    recipe's model: a checkpoint holds no tokenizer). Files are linked, not copied."""
    trainer = Path(run_dir) / "checkpoints" / f"step_{step:06d}" / "trainer"
    if not (trainer.parent / "COMPLETE").is_file():
        raise FileNotFoundError(f"{trainer.parent}: no complete checkpoint of step {step} (kept: checkpoint.keep_last)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for source in ([trainer / "config.json", trainer / "model.safetensors"]
                   + [Path(tokenizer_from) / f for f in TOKENIZER_FILES]):
        if not source.is_file():
            raise FileNotFoundError(f"{source}: missing, needed for the model folder of step {step}")
        target = out / source.name
        target.unlink(missing_ok=True)
        target.symlink_to(source.resolve())
    return out


def position_table(position_rows: list[dict], stat: str):
    """``stat`` (k1, k3, abs_diff, indexer_disagree, routing_flip) by configuration (rows, in their order) and
    bucket start (columns), token-weighted over seeds."""
    import pandas as pd

    frame = pd.DataFrame(position_rows)
    frame["weighted"] = frame[stat] * frame["tokens"]
    grouped = frame.groupby(["config", "start"], sort=False)[["weighted", "tokens"]].sum()
    return (grouped["weighted"] / grouped["tokens"]).unstack("start")
