"""The GRPO steps every trainer backend inherits: ``train_step``, ``scored_train_step`` and ``gradients`` are
written once here, over the update's rules (``repro.train.grpo_update.GRPOUpdate``). A backend supplies two hooks:

    accumulate_gradients(batch, logprobs_out)   the update's loss over ``batch`` backed into the gradients (zeroed
                                                first) through the backend's own forward/backward; returns the
                                                sums; with ``logprobs_out``, pi_old written into it on the way
    optimizer_step(lr)                          clip and apply the gradients; returns the pre-clip global norm

and declares what it can do in ``capabilities`` (``repro.recipes.backends.TRAINERS``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import torch

from repro import metric_keys as K
from repro.recipes.backends import TrainerCapabilities
from repro.recipes.schema import OptimConfig
from repro.train.base import LogprobResult, StateParts, TrainerError
from repro.train.batch import TrainBatch
from repro.train.batch_checks import check_batch
from repro.train.faults import nan_gradient_update, poison_gradient
from repro.train.grpo_update import COUNT_METRICS, GRPOUpdate, UpdateStats, update_metrics
from repro.train.optimizer import warmup_constant_lr


class GRPOTrainer:
    """What both trainers share; the subclass sets these attributes in its constructor."""

    capabilities: ClassVar[TrainerCapabilities]
    grpo: GRPOUpdate
    optim: OptimConfig
    model: torch.nn.Module
    opt: Any            # the fp32-master AdamW interface (repro.train.optimizer), or megatron's behind it
    routers: dict       # the model's top-k routers by layer, for the batch's routing checks (R3)
    replay_routing: bool
    dtype_name: str
    step: int           # completed train_step calls
    updates: int        # completed optimizer updates (drives the warm-up)

    # ---- the backend's hooks -------------------------------------------------------------------------------

    def accumulate_gradients(self, batch: TrainBatch, logprobs_out: LogprobResult | None) -> UpdateStats:
        """Back the update's loss over ``batch`` into the gradients (zeroed first). With ``logprobs_out`` (only where
        ``capabilities.scores_in_update``): pi_old of every row, written into it from the update's own forward."""
        raise NotImplementedError

    def optimizer_step(self, lr: float) -> float:
        """Clip and apply the accumulated gradients at ``lr``; returns the pre-clip global norm."""
        return self.opt.step(lr)

    # ---- the steps -----------------------------------------------------------------------------------------

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """``updates_per_step`` optimizer updates on ``batch``; returns verl-named metrics (means over updates).

        ``actor/entropy_nonzero_adv`` and ``actor/pg_clipfrac*`` are token means over the rows that went through
        a forward (zero-advantage rows are skipped), ``actor/ppo_kl`` a mean over every kept token
        (``repro.train.grpo_update.update_metrics``); ``actor/grad_norm`` is the norm before clipping.
        """
        check_batch(batch, self.routers, need_old=True, replay=self.replay_routing, caller="train_step")
        metrics = self._updates(batch, None)
        self.updates += len(self.grpo.row_groups(batch))
        self.step += 1
        return metrics

    def scored_train_step(self, batch: TrainBatch) -> tuple[LogprobResult, dict[str, float]]:
        """``train_step`` on a batch without ``old_logprobs``: pi_old comes from the update's own first forward
        (rows it skips get a no-grad pass). Returns pi_old's [B, T] log-probs and entropies -- the numbers
        ``logprobs(batch, replay_routing)`` gives -- and the metrics. Only where that is exact: one update per
        step, a non-rejecting correction mode (``repro.train.grpo_update.scores_in_update``)."""
        if not self.capabilities.scores_in_update:
            raise TrainerError(f"scored_train_step: the {type(self).__name__} backend takes pi_old from a separate "
                               "pass (repro.recipes.backends: scores_in_update is false)")
        if not self.grpo.scores_in_update:
            raise TrainerError(
                f"scored_train_step: algorithm.updates_per_step={self.grpo.algorithm.updates_per_step} and "
                f"rollout_correction.mode={self.grpo.correction.mode!r} need pi_old from a separate pass first")
        check_batch(batch, self.routers, need_old=False, replay=self.replay_routing, caller="scored_train_step")
        logprobs_out = LogprobResult(torch.zeros(batch.input_ids.shape), torch.zeros(batch.input_ids.shape))
        metrics = self._updates(replace(batch, old_logprobs=None), logprobs_out)
        self.updates += 1
        self.step += 1
        return logprobs_out, metrics

    def gradients(self, batch: TrainBatch) -> dict[str, torch.Tensor]:
        """name -> fp32 gradient of the first update's loss on ``batch`` (unclipped; this rank's shard);
        weights stay untouched."""
        check_batch(batch, self.routers, need_old=True, replay=self.replay_routing, caller="gradients")
        self.accumulate_gradients(batch.rows(self.grpo.row_groups(batch)[0]), None)
        grads = {name: g.clone() for name, g in zip(self.opt.names, self.opt.master_grads())}
        self.opt.zero_grad()
        return grads

    def _updates(self, batch: TrainBatch, logprobs_out: LogprobResult | None) -> dict[str, float]:
        """One optimizer update per row group of ``batch``; means of their metrics (counts summed, the last
        update's lr). The warm-up counts from the updates done so far."""
        per_update = []
        fault = nan_gradient_update()
        for index, rows in enumerate(self.grpo.row_groups(batch)):
            stats = self.accumulate_gradients(batch.rows(rows), logprobs_out)
            if fault == self.updates + index + 1:
                poison_gradient(self.model)  # an injected fault (repro.train.faults): this update must be skipped
            lr = warmup_constant_lr(self.optim, self.updates + index)
            per_update.append(update_metrics(stats, self.optimizer_step(lr), lr))
        metrics = {key: sum(m[key] for m in per_update) / len(per_update) for key in per_update[0]}
        for key in COUNT_METRICS:
            metrics[key] = float(sum(m[key] for m in per_update))
        metrics[K.LR] = per_update[-1][K.LR]
        return metrics

    # ---- state ---------------------------------------------------------------------------------------------

    def state_parts(self) -> StateParts:
        return StateParts(self.model, self.opt, self.dtype_name, self.step, self.updates)
