"""The embedded torch trainer: GRPO updates of a (tiny) DeepSeek-V4 on CPU, the loss the Megatron run uses.

The update itself (rows, normalisers, each micro-batch's loss share, metrics) is ``repro.train.grpo_update``, the
steps around it ``repro.train.grpo_trainer``; this class runs its forwards and backwards with plain torch --
token-budget micro-batches, each forward inside ``RoutingReplay`` (R3) when the recipe asks -- and steps an
fp32-master AdamW over the whole model.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Iterator

import torch

from repro import metric_keys as K
from repro.algos import entropy_from_logits, logprobs_from_logits
from repro.model import layouts
from repro.model.hf_folder import load_tiny_model
from repro.model.hyper_connection import use_entrywise_hyper_connections
from repro.model.routing import RoutingReplay, topk_routers
from repro.model.served import export_weights, served_weights
from repro.recipes import resolve_path
from repro.recipes.backends import TRAINERS
from repro.recipes.schema import Recipe
from repro.train import trainer_state as saved_state
from repro.train.base import LogprobResult, StateParts
from repro.train.batch import TrainBatch, micro_batches
from repro.train.batch_checks import check_batch
from repro.train.bf16_gemm import FP32, NATIVE, gemm_context, resolve_bf16_gemm
from repro.train.grpo_trainer import GRPOTrainer
from repro.train.grpo_update import TrainerSettings, UpdatePlan, UpdateStats
from repro.train.optimizer import MasterAdamW
from repro.train.precision import COMPUTE_DTYPES, cast_for_training
from repro.train.stable_shapes import use_stable_gemm_shapes
from repro.train.threads import ThreadedReplicas, balanced_shares


class EmbeddedTrainer(GRPOTrainer):
    """GRPO trainer for a Hugging Face DeepSeek-V4 model on CPU (its steps: ``GRPOTrainer``).

    Args:
        model: a ``DeepseekV4ForCausalLM`` or a safetensors checkpoint folder holding one.
        settings: what every trainer backend takes from the recipe (``TrainerSettings``).
        update_threads: threads that split each update's and each scoring pass's rows (``repro.train.threads``).
        bf16_gemm: ``"auto"``, ``"native"`` or ``"fp32"``: how a BF16 trainer's GEMMs compute on this CPU
            (``repro.train.bf16_gemm``), resolved once here into ``self.bf16_gemm`` (an fp32 trainer has no BF16
            GEMM: ``None``).
    """

    capabilities = TRAINERS["embedded"]

    def __init__(
        self,
        model: torch.nn.Module | str | Path,
        settings: TrainerSettings,
        *,
        update_threads: int = 1,
        bf16_gemm: str = "auto",
    ):
        if isinstance(model, (str, Path)):
            torch.manual_seed(settings.seed)
            model = load_tiny_model(model)
        self.settings = settings
        self.optim = settings.optim
        self.grpo = settings.update_rules("embedded")
        self.dtype_name, self.dtype = settings.dtype, COMPUTE_DTYPES[settings.dtype]
        resolved = resolve_bf16_gemm(bf16_gemm)  # an unknown name fails for fp32 trainers too
        self.bf16_gemm = resolved if self.dtype == torch.bfloat16 else None
        self._gemms = gemm_context(self.bf16_gemm or NATIVE)
        self.max_tokens = settings.max_tokens_per_micro_batch
        self.temperature = settings.temperature
        self.replay_routing = settings.replay_routing
        torch.manual_seed(settings.seed)
        # What the weight export must reproduce: the served checkpoint's names, shapes and dtypes (taken before
        # the cast, so a model built in memory exports the dtypes it was built in).
        self.served = served_weights(model)
        v4 = self.served.layout in (layouts.DEEPSEEK, layouts.HF)
        self.model = cast_for_training(model, settings.dtype,
                                       keep_fp32=layouts.keeps_fp32 if v4 else (lambda name: False))
        use_entrywise_hyper_connections(self.model)  # same numbers, ~25% less forward + backward time on CPU
        if self.bf16_gemm == NATIVE:  # BF16 matmuls run through shape-specific oneDNN primitives; FP32 through MKL
            use_stable_gemm_shapes(self.model)  # same numbers, a few row counts per weight for the whole run
        self.routers = topk_routers(model)
        self.opt = MasterAdamW(model, self.optim)
        self.replicas = ThreadedReplicas(self.model, update_threads)
        self.opt.zero_grad()
        self.step = 0      # completed train_step calls
        self.updates = 0   # completed optimizer updates (drives the warm-up)

    @classmethod
    def from_recipe(cls, recipe: Recipe, model_dir: str | Path | None = None, **overrides) -> "EmbeddedTrainer":
        """The trainer a recipe describes; ``model_dir`` defaults to ``recipe.model.path`` (``builtin:`` resolved);
        ``overrides`` name ``TrainerSettings`` fields or this constructor's own arguments."""
        if model_dir is None:
            model_dir = resolve_path(recipe.model.path)
        changes, own = TrainerSettings.split(overrides)
        own = {"update_threads": recipe.actor.cpu_update_threads, "bf16_gemm": recipe.actor.bf16_gemm, **own}
        return cls(model_dir, TrainerSettings.from_recipe(recipe, **changes), **own)

    # ---- scoring -------------------------------------------------------------------------------------------

    def _forward(self, model: torch.nn.Module, micro: TrainBatch, replay: bool) -> torch.Tensor:
        """[b, t, V] logits of one micro-batch, with its recorded experts forced when ``replay``, its GEMMs on the
        trainer's BF16 path (the mode is per thread, so it is entered here, in the thread that forwards)."""
        context = RoutingReplay(model, micro.routing) if replay else nullcontext()
        with context, self._gemms():
            return model(input_ids=micro.input_ids, use_cache=False).logits

    def logprobs(self, batch: TrainBatch, replay_routing: bool = True) -> LogprobResult:
        """[B, T] log-probs and entropies of the batch's targets at the sampling temperature (0 off-response)."""
        check_batch(batch, self.routers, need_old=False, replay=replay_routing, caller="logprobs")
        logprobs_out = LogprobResult(torch.zeros(batch.input_ids.shape), torch.zeros(batch.input_ids.shape))
        self.replicas.run([[partial(self._score_rows, batch, rows, replay_routing, logprobs_out)
                            for rows in groups]
                           for groups in self._scoring_row_groups(batch)])
        return logprobs_out

    def _score_rows(self, batch: TrainBatch, rows: torch.Tensor, replay: bool, logprobs_out: LogprobResult,
                    model: torch.nn.Module) -> None:
        """Write the log-probs and entropies of ``batch``'s [r] ``rows`` into ``logprobs_out``, forwarding on
        ``model``
        (a no-grad pass: grad mode is per thread, so it is set here rather than by the caller)."""
        start = 0
        with torch.no_grad():
            for micro in micro_batches(batch.rows(rows), self.max_tokens):
                logits = self._forward(model, micro, replay)
                mask = micro.response_mask
                lp = logprobs_from_logits(logits, micro.targets, self.temperature)
                ent = entropy_from_logits(logits, self.temperature)
                write_logprobs(logprobs_out, rows[start : start + micro.num_rows], torch.where(mask, lp, 0.0),
                             torch.where(mask, ent, 0.0))
                start += micro.num_rows

    def _row_shares(self, batch: TrainBatch, plan: UpdatePlan | None) -> tuple[list, list]:
        """(the rows ``plan`` forwards, the other rows), each split into one share per update thread, balanced by
        response width; empty shares are [] entries, so index i is thread i's."""
        forwarded = plan.rows if plan is not None else torch.zeros(0, dtype=torch.int64)
        widths = batch.response_mask.int().cumsum(dim=1).argmax(dim=1) + 1
        rest = torch.ones(batch.num_rows, dtype=torch.bool).index_fill(0, forwarded, False).nonzero().squeeze(1)
        split = []
        for rows in (forwarded, rest):
            shares = balanced_shares(rows, widths[rows], self.replicas.threads)
            split.append(shares + [rows[:0]] * (self.replicas.threads - len(shares)))
        return split[0], split[1]

    def _scoring_row_groups(self, batch: TrainBatch) -> list[list[torch.Tensor]]:
        """Per update thread, the [r] row groups it scores, in order: with one update per step, its share of the
        rows the update will forward, in the update's micro-batches, then its share of the rest. A forward's
        rounding depends on its micro-batch's shape, so only then is pi_old the very computation of the update's
        first forward (ratio exactly 1, and the same numbers ``scored_train_step`` takes from that forward);
        otherwise its share of all rows."""
        plan = None
        if self.grpo.scores_in_update and batch.advantages.shape == (batch.num_rows,):
            plan = self.grpo.plan(replace(batch, old_logprobs=None), UpdateStats())
        shares, rests = self._row_shares(batch, plan)
        return [[rows for rows in (share, rest) if len(rows)] for share, rest in zip(shares, rests)]

    # ---- training ------------------------------------------------------------------------------------------

    def accumulate_gradients(self, batch: TrainBatch, logprobs_out: LogprobResult | None) -> UpdateStats:
        """The hook of ``GRPOTrainer``: backward the update's loss over ``batch`` into the parameters' ``.grad``
        (zeroed first).

        With ``logprobs_out`` ([B, T] tensors, filled here) and no ``batch.old_logprobs``: pi_old of each forwarded
        row is its own log-probs from this forward (detached; the ratio is then exactly 1, as after a separate
        rescoring), and the rows the update skips are scored by a no-grad pass, for the metrics only. Each update
        thread backwards its share of the rows, then scores its share of the skipped ones."""
        self.opt.zero_grad()
        stats = UpdateStats()
        plan = self.grpo.plan(batch, stats)
        shares, skipped = self._row_shares(batch, plan)
        per_thread = [UpdateStats() for _ in shares]
        work = []
        for share, rest, share_stats in zip(shares, skipped, per_thread):
            jobs = [partial(self._backward_rows, batch, share, plan, share_stats, logprobs_out)] if len(share) else []
            if logprobs_out is not None and len(rest):
                jobs.append(partial(self._score_rows, batch, rest, self.replay_routing, logprobs_out))
            work.append(jobs)
        self.replicas.run(work)
        self.replicas.add_gradients_into_model()
        for share_stats in per_thread:
            stats.add(share_stats)
        return stats

    def _backward_rows(self, batch: TrainBatch, rows: torch.Tensor, plan: UpdatePlan, stats: UpdateStats,
                       logprobs_out: LogprobResult | None, model: torch.nn.Module) -> None:
        """Forward and backward ``batch``'s [r] ``rows`` on ``model`` in token-budget micro-batches (see
        ``accumulate_gradients``), adding their sums to ``stats``."""
        start = 0
        for micro in micro_batches(batch.rows(rows), self.max_tokens):
            logits = self._forward(model, micro, self.replay_routing)
            logp = logprobs_from_logits(logits, micro.targets, self.temperature)
            with torch.no_grad():
                entropy = entropy_from_logits(logits.detach(), self.temperature)
                if logprobs_out is not None:
                    micro = replace(micro, old_logprobs=torch.where(micro.response_mask, logp.detach(), 0.0))
                    write_logprobs(logprobs_out, rows[start : start + micro.num_rows], micro.old_logprobs,
                                 torch.where(micro.response_mask, entropy, 0.0))
                    start += micro.num_rows
            self.grpo.micro_loss(micro, logp, entropy, plan, stats).backward()

    def _updates(self, batch: TrainBatch, logprobs_out: LogprobResult | None) -> dict[str, float]:
        """``GRPOTrainer._updates`` with the BF16 GEMM path in every step's metrics (a BF16 trainer's only)."""
        metrics = super()._updates(batch, logprobs_out)
        if self.bf16_gemm is not None:
            metrics[K.BF16_GEMM_FP32] = float(self.bf16_gemm == FP32)
        return metrics

    # ---- weights and state ---------------------------------------------------------------------------------

    def state_parts(self) -> StateParts:
        return replace(super().state_parts(), bf16_gemm=self.bf16_gemm)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor the served checkpoint holds, as it names and types them: detached CPU copies.

        A DeepSeek-V4 folder in the release layout exports release names (``embed.weight``,
        ``layers.L.ffn.experts.E.w1.weight``); an in-memory model its state-dict names. Each tensor goes out in
        the checkpoint's dtype (FP32 hyper-connections stay FP32 whatever the trainer computes in). The MTP layer
        is left out: no trainer holds it (``repro.model.layouts.MTP_REASON``).
        """
        yield from export_weights(self.served, self.model.state_dict())

    def sync_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """What the weight sync sends: every weight (``named_weights``); this trainer is one rank."""
        return self.named_weights()

    def sync_sender(self) -> int | None:
        return 0

    def save(self, directory: str | Path) -> Path:
        """Write the full training state to ``directory`` (replaced atomically); see ``repro.train.trainer_state``."""
        return saved_state.save_trainer(self.state_parts(), directory)

    def load(self, directory: str | Path) -> None:
        self.step, self.updates = saved_state.load_trainer(self.state_parts(), directory)


def write_logprobs(logprobs_out: LogprobResult, rows: torch.Tensor, logprobs: torch.Tensor,
                   entropy: torch.Tensor) -> None:
    """Put [r, t] log-probs and entropies of ``rows`` ([r] indices) into the [B, T] ``logprobs_out`` (t <= T)."""
    width = logprobs.shape[1]
    logprobs_out.logprobs[rows, :width] = logprobs
    logprobs_out.entropy[rows, :width] = entropy


def build_trainer(recipe: Recipe, model_dir: str | Path) -> EmbeddedTrainer:
    """The trainer of ``repro.recipes.backends.TRAINERS["embedded"]``."""
    return EmbeddedTrainer.from_recipe(recipe, model_dir)
