"""The embedded torch trainer: GRPO updates of a (tiny) DeepSeek-V4 on CPU, the loss the Megatron run uses.

One ``train_step`` = the batch split into ``updates_per_step`` row groups, one AdamW update each. Per update:

  1. decoupled TIS weights w = min(exp(old - rollout), C) from the trainer's recompute (``batch.old_logprobs``)
     and the rollout engine's log-probs -- fixed before any forward, so the loss mask and its normaliser are
     known up front;
  2. rows whose advantage is exactly 0 are skipped: their loss is -0 * ratio * w = 0 for every token, so their
     forward/backward would add exactly nothing, but they still count in the normaliser (GRPO's zero-variance
     groups are 25-40% of the rows on this task);
  3. the remaining rows go through token-budget micro-batches, each forward inside ``RoutingReplay`` (R3) when
     the recipe asks, each micro-batch's aggregated loss rescaled to its share of the whole update so the
     accumulated gradient equals the one-big-batch gradient whatever the micro-batching;
  4. global-norm clip, AdamW.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from repro.algos import (
    agg_loss,
    broadcast_to_tokens,
    entropy_from_logits,
    logprobs_from_logits,
    ppo_clip_loss,
    rollout_is_weights,
)
from repro.recipes.schema import AlgorithmConfig, OptimConfig, Recipe, RolloutCorrectionConfig
from repro.model import layouts
from repro.model.routing import RoutingReplay, topk_routers
from repro.model.served import export_weights, served_weights
from repro.train.base import LogprobResult, TrainerError
from repro.train.batch import TrainBatch, micro_batches
from repro.train.batch_checks import check_batch
from repro.train.optimizer import MasterAdamW, warmup_constant_lr
from repro.train import trainer_state as saved_state

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class _UpdateStats:
    """Sums over one update's forwarded micro-batches; token-weighted means are formed at the end."""

    loss: float = 0.0
    tokens: float = 0.0            # kept response tokens that went through a forward
    response_tokens: float = 0.0   # all response tokens that went through a forward (entropy's denominator)
    entropy_sum: float = 0.0
    clipfrac_sum: float = 0.0
    clipfrac_lower_sum: float = 0.0
    ppo_kl_sum: float = 0.0
    rows_skipped: int = 0
    micro_batches: int = 0


def check_settings(dtype: str, max_tokens: int, temperature: float, algorithm: AlgorithmConfig, backend: str) -> None:
    """Refuse settings a trainer backend cannot honour, naming each."""
    if dtype not in DTYPES:
        raise TrainerError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if max_tokens < 1 or temperature <= 0:
        raise TrainerError(
            f"max_tokens_per_micro_batch must be >= 1 and temperature > 0, got {max_tokens} and {temperature}"
        )
    if algorithm.kl_coef != 0 or algorithm.entropy_coef != 0:
        # Both would also make zero-advantage rows carry gradient, which the row skipping relies on not doing.
        raise TrainerError(
            f"algorithm.kl_coef={algorithm.kl_coef}, entropy_coef={algorithm.entropy_coef}: the "
            f"{backend} trainer implements neither (the reproduced run uses 0 for both)"
        )


def recipe_settings(recipe: Recipe) -> dict:
    """The trainer constructor arguments every backend takes from the recipe (the model comes separately)."""
    return dict(
        optim=recipe.optim,
        algorithm=recipe.algorithm,
        rollout_correction=recipe.rollout_correction,
        dtype=recipe.actor.dtype,
        max_tokens_per_micro_batch=recipe.actor.max_tokens_per_micro_batch,
        temperature=recipe.rollout.temperature,
        replay_routing=recipe.routing_replay.enabled,
        seed=recipe.seed,
    )


class EmbeddedTrainer:
    """GRPO trainer for a Hugging Face DeepSeek-V4 model on CPU.

    Args:
        model: a ``DeepseekV4ForCausalLM`` or a safetensors checkpoint folder holding one.
        optim, algorithm, rollout_correction: the recipe sections of the same names.
        dtype: ``"fp32"`` or ``"bf16"`` (compute dtype; AdamW keeps fp32 masters either way).
        max_tokens_per_micro_batch: padded tokens (rows x width) per forward.
        temperature: the rollout's sampling temperature; log-probs are of softmax(logits / temperature).
        replay_routing: R3 in ``train_step`` (``logprobs`` takes its own flag).
        skip_zero_advantage_rows: skip the forward/backward of rows with advantage exactly 0 (same gradient).
        seed: seeds torch's RNG once at construction (the forward itself draws no random numbers).
    """

    def __init__(
        self,
        model: torch.nn.Module | str | Path,
        *,
        optim: OptimConfig | None = None,
        algorithm: AlgorithmConfig | None = None,
        rollout_correction: RolloutCorrectionConfig | None = None,
        dtype: str = "fp32",
        max_tokens_per_micro_batch: int = 16384,
        temperature: float = 1.0,
        replay_routing: bool = True,
        skip_zero_advantage_rows: bool = True,
        seed: int = 0,
    ):
        torch.manual_seed(seed)
        if isinstance(model, (str, Path)):
            from repro.model.hf_folder import load_tiny_model

            model = load_tiny_model(model)
        self._setup(model, topk_routers, "embedded", optim=optim, algorithm=algorithm,
                    rollout_correction=rollout_correction, dtype=dtype, max_tokens=max_tokens_per_micro_batch,
                    temperature=temperature, replay_routing=replay_routing,
                    skip_zero_advantage_rows=skip_zero_advantage_rows, seed=seed)

    def _setup(self, model, find_routers, backend: str, *, optim, algorithm, rollout_correction, dtype: str,
               max_tokens: int, temperature: float, replay_routing: bool, skip_zero_advantage_rows: bool,
               seed: int) -> None:
        """What every backend's constructor does once it has its model: check, cast, build the optimizer."""
        self.optim = optim or OptimConfig()
        self.algorithm = algorithm or AlgorithmConfig()
        self.correction = rollout_correction or RolloutCorrectionConfig()
        check_settings(dtype, max_tokens, temperature, self.algorithm, backend)
        self.dtype_name = dtype
        self.dtype = DTYPES[dtype]
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.replay_routing = replay_routing
        self.skip_zero_advantage_rows = skip_zero_advantage_rows
        torch.manual_seed(seed)
        # What the weight export must reproduce: the served checkpoint's names, shapes and dtypes (taken before
        # the cast below, so a model built in memory exports the dtypes it was built in).
        # (A Megatron module is no Hugging Face model: its backend exports through its own name table.)
        self.served = served_weights(model) if hasattr(getattr(model, "config", None), "model_type") else None
        v4 = self.served is not None and self.served.layout in (layouts.DEEPSEEK, layouts.HF)
        # Parameters only: rotary inv_freq buffers stay fp32, as Hugging Face's own bf16 loading keeps them. The
        # tensors the release stores in FP32 (hyper-connections, sinks, compressor position bias) stay FP32 too,
        # as LumenRL keeps them: BF16 would round them in every update and every sync.
        for name, param in model.named_parameters():
            if not (v4 and layouts.keeps_fp32(name)):
                param.data = param.data.to(self.dtype)
        self.model = model.eval()  # eval: V4 has no dropout to switch on, and generate() expects eval mode
        self.routers = find_routers(model)
        self.opt = MasterAdamW(model, self.optim)
        self.opt.zero_grad()
        self.step = 0      # completed train_step calls
        self.updates = 0   # completed optimizer updates (drives the warm-up)

    @classmethod
    def from_recipe(cls, recipe: Recipe, model_dir: str | Path | None = None, **overrides) -> "EmbeddedTrainer":
        """The trainer a recipe describes; ``model_dir`` defaults to ``recipe.model.path`` (``builtin:`` resolved)."""
        if model_dir is None:
            from repro.recipes import resolve_path

            model_dir = resolve_path(recipe.model.path)
        return cls(model_dir, **{**recipe_settings(recipe), **overrides})

    # ---- scoring -------------------------------------------------------------------------------------------

    def _forward(self, micro: TrainBatch, replay: bool) -> torch.Tensor:
        """[b, t, V] logits of one micro-batch, with its recorded experts forced when ``replay``."""
        context = RoutingReplay(self.model, micro.routing) if replay else nullcontext()
        with context:
            return self.model(input_ids=micro.input_ids, use_cache=False).logits

    @torch.no_grad()
    def logprobs(self, batch: TrainBatch, replay_routing: bool = True) -> LogprobResult:
        """[B, T] log-probs and entropies of the batch's targets at the sampling temperature (0 off-response)."""
        check_batch(batch, self.routers, need_old=False, replay=replay_routing, caller="logprobs")
        logprobs = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        entropy = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        start = 0
        for micro in micro_batches(batch, self.max_tokens):
            rows, width = micro.input_ids.shape
            logits = self._forward(micro, replay_routing)
            mask = micro.response_mask
            lp = logprobs_from_logits(logits, micro.targets, self.temperature)
            ent = entropy_from_logits(logits, self.temperature)
            logprobs[start : start + rows, :width] = torch.where(mask, lp, 0.0)
            entropy[start : start + rows, :width] = torch.where(mask, ent, 0.0)
            start += rows
        return LogprobResult(logprobs, entropy)

    # ---- training ------------------------------------------------------------------------------------------

    def _accumulate_gradients(self, batch: TrainBatch) -> _UpdateStats:
        """Backward the update's loss over ``batch`` into the parameters' ``.grad`` (zeroed first)."""
        self.opt.zero_grad()
        stats = _UpdateStats()
        plan = self._update_plan(batch, stats)
        if plan is None:
            return stats
        rows, totals = plan
        for micro in micro_batches(batch.rows(rows), self.max_tokens):
            logits = self._forward(micro, self.replay_routing)
            logp = logprobs_from_logits(logits, micro.targets, self.temperature)
            with torch.no_grad():
                entropy = entropy_from_logits(logits.detach(), self.temperature)
            self._micro_loss(micro, logp, entropy, totals, stats).backward()
        return stats

    def _update_plan(self, batch: TrainBatch, stats: _UpdateStats) -> tuple[torch.Tensor, tuple[int, int]] | None:
        """Which rows of ``batch`` go through a forward, and the update's normalisers (kept tokens, kept rows);
        None when nothing does. Counts the skipped zero-advantage rows into ``stats``."""
        keep = self._is_weights(batch).keep_mask
        total_tokens = int(keep.sum())
        total_rows = int(keep.any(dim=1).sum())
        if total_tokens == 0:
            return None
        forwarded = keep.any(dim=1)  # rows with no kept token (all rejected, or no response) add nothing either
        if self.skip_zero_advantage_rows:
            stats.rows_skipped = int((forwarded & (batch.advantages == 0)).sum())
            forwarded &= batch.advantages != 0
        if not forwarded.any():
            return None
        return forwarded.nonzero().squeeze(1), (total_tokens, total_rows)

    def _micro_loss(self, micro: TrainBatch, logp: torch.Tensor, entropy: torch.Tensor,
                    totals: tuple[int, int], stats: _UpdateStats) -> torch.Tensor:
        """This micro-batch's share of the update's loss from its [b, t] log-probs (and, for the metrics, its
        [b, t] entropies); adds its sums to ``stats``."""
        total_tokens, total_rows = totals
        micro_w = self._is_weights(micro)
        micro_keep = micro_w.keep_mask
        policy = ppo_clip_loss(
            logp,
            micro.old_logprobs,
            broadcast_to_tokens(micro.advantages, micro.response_mask),
            micro_keep,
            clip_low=self.algorithm.clip_ratio_low,
            clip_high=self.algorithm.clip_ratio_high,
            is_weights=micro_w.weights,
        )
        # Each micro-batch's mean, weighted by its share of the update's normaliser (tokens or sequences),
        # sums to the mean over the whole update.
        mode = self.algorithm.loss_agg_mode
        if mode == "token-mean":
            share = int(micro_keep.sum()) / total_tokens
        else:
            share = int(micro_keep.any(dim=1).sum()) / total_rows
        loss = agg_loss(policy.loss_mat, micro_keep, mode) * share
        with torch.no_grad():
            tokens = float(micro_keep.sum())
            stats.loss += float(loss)
            stats.tokens += tokens
            stats.response_tokens += float(micro.response_mask.sum())
            stats.entropy_sum += float((entropy * micro.response_mask).sum())
            stats.clipfrac_sum += float(policy.pg_clipfrac) * tokens
            stats.clipfrac_lower_sum += float(policy.pg_clipfrac_lower) * tokens
            stats.ppo_kl_sum += float(policy.ppo_kl) * tokens
            stats.micro_batches += 1
        return loss

    def _is_weights(self, batch: TrainBatch):
        return rollout_is_weights(
            batch.old_logprobs,
            batch.rollout_logprobs,
            batch.response_mask,
            mode=self.correction.mode,
            threshold=self.correction.threshold,
            threshold_lower=self.correction.lower_threshold,
        )

    def _update_row_groups(self, batch: TrainBatch) -> list[torch.Tensor]:
        count = self.algorithm.updates_per_step
        if count > batch.num_rows:
            raise TrainerError(f"algorithm.updates_per_step={count} exceeds the batch's {batch.num_rows} rows")
        return list(torch.arange(batch.num_rows).tensor_split(count))

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """``updates_per_step`` AdamW updates on ``batch``; returns verl-named metrics (means over updates).

        ``actor/entropy``, ``actor/pg_clipfrac*`` and ``actor/ppo_kl`` are token means over the rows that went
        through a forward (zero-advantage rows are skipped); ``actor/grad_norm`` is the norm before clipping.
        """
        check_batch(batch, self.routers, need_old=True, replay=self.replay_routing, caller="train_step")
        per_update = []
        for rows in self._update_row_groups(batch):
            stats = self._accumulate_gradients(batch.rows(rows))
            lr = warmup_constant_lr(self.optim, self.updates)
            grad_norm = self._optimizer_step(lr)
            self.updates += 1
            per_token = max(stats.tokens, 1.0)
            per_update.append({
                "actor/loss": stats.loss,
                "actor/grad_norm": grad_norm,
                "actor/entropy": stats.entropy_sum / max(stats.response_tokens, 1.0),
                "actor/pg_clipfrac": stats.clipfrac_sum / per_token,
                "actor/pg_clipfrac_lower": stats.clipfrac_lower_sum / per_token,
                "actor/ppo_kl": stats.ppo_kl_sum / per_token,
                "actor/lr": lr,
                "actor/num_rows_skipped_zero_adv": float(stats.rows_skipped),
                "actor/micro_batches": float(stats.micro_batches),
            })
        self.step += 1
        metrics = {key: sum(m[key] for m in per_update) / len(per_update) for key in per_update[0]}
        for key in ("actor/num_rows_skipped_zero_adv", "actor/micro_batches"):
            metrics[key] = float(sum(m[key] for m in per_update))  # counts add up over updates
        metrics["actor/lr"] = per_update[-1]["actor/lr"]
        return metrics

    def _optimizer_step(self, lr: float) -> float:
        """Clip and apply the accumulated gradients; the pre-clip norm (a model-parallel backend reduces first)."""
        return self.opt.step(lr)

    def gradients(self, batch: TrainBatch) -> dict[str, torch.Tensor]:
        """name -> fp32 gradient of the first update's loss on ``batch`` (unclipped); weights stay untouched."""
        check_batch(batch, self.routers, need_old=True, replay=self.replay_routing, caller="gradients")
        self._accumulate_gradients(batch.rows(self._update_row_groups(batch)[0]))
        grads = {name: g.clone() for name, g in zip(self.opt.names, self.opt.master_grads())}
        self.opt.zero_grad()
        return grads

    # ---- weights and state ---------------------------------------------------------------------------------

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor the served checkpoint holds, as it names and types them: detached CPU copies.

        A DeepSeek-V4 folder in the release layout exports release names (``embed.weight``,
        ``layers.L.ffn.experts.E.w1.weight``); an in-memory model its state-dict names. Each tensor goes out in
        the checkpoint's dtype (FP32 hyper-connections stay FP32 whatever the trainer computes in). The MTP layer
        is left out: no trainer holds it (``repro.model.layouts.MTP_REASON``).
        """
        yield from export_weights(self.served, self.model.state_dict())

    def save(self, directory: str | Path) -> Path:
        """Write the full training state to ``directory`` (replaced atomically); see ``repro.train.trainer_state``."""
        return saved_state.save_trainer(self, directory)

    def load(self, directory: str | Path) -> None:
        saved_state.load_trainer(self, directory)
