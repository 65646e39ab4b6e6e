"""The Megatron-core trainer backend: the same GRPO/TIS update as the embedded trainer, on a megatron-core model.

Parts:

  ``megatron_layout(recipe)``   (``repro.train.megatron.config``) pure: the recipe's actor/optim/routing sections ->
                                keyword arguments of ``parallel_state.initialize_model_parallel``,
                                ``TransformerConfig``, ``OptimizerConfig`` and ``DistributedDataParallelConfig``
                                (AMD: TP4/PP4/EP4/ETP1, sequence parallel, full recompute, bf16, distributed
                                optimizer offloaded to CPU).
                                No megatron import, no process group: tested as plain dicts.
  ``MegatronTrainer``           the ``Trainer`` protocol on one trainer rank. The update (decoupled TIS weights
                                fixed up front, zero-advantage rows skipped but counted, token-budget micro-batches
                                each weighted by its share of the update's normaliser, global-norm clip, fp32-master
                                AdamW with warm-up) is ``repro.train.grpo_update`` and the steps around it
                                ``repro.train.grpo_trainer``, which both backends inherit, so both compute the
                                one loss of ``repro.algos``; this class runs it through megatron's forward/backward
                                schedule (1F1B across pipeline stages), scores a vocabulary split over TP ranks,
                                reduces gradients over DP and takes the clip norm over all model-parallel ranks
                                (``repro.train.megatron.parallel``), and exports full weights for the sync.
  the model                     ``actor.model_provider``: ``repro.train.megatron.tiny:provider`` on CPU (megatron-core
                                has no DeepSeek-V4 layers); a DSV4 provider on a cluster (docs/megatron-dsv4.md).

R3 on megatron-core 0.16.1: with ``moe_enable_routing_replay`` every ``TopKRouter`` owns a ``RouterReplay``.
``REPLAY_FORWARD`` makes its top-k return the given indices with probabilities gathered from this forward's own
scores, so the router weight keeps its gradient; ``RECORD`` stores what the router chose. The trainer drives each
router's instance directly (never megatron's process-global list, which every model built in the process joins)
and re-arms a micro-batch's experts when its backward starts, so a full-recompute backward re-runs the same
experts even after 1F1B has run later forwards. Megatron routes a ``[seq * batch]`` token order (sequence
first), so ``[B, T, k]`` tables are transposed.

On CPU ``repro.train.megatron.cpu_shim`` patches megatron-core's CUDA assumptions (gloo, any world size). The
optimizer is chosen in one place, ``repro.train.megatron.optimizers.trainer_optimizer``: on a GPU megatron's own
(``get_megatron_optimizer``: distributed, CPU-offloaded, BF16 moments as the recipe says), on CPU the project's
fp32-master AdamW, ZeRO-1-sharded over data-parallel replicas when distributed (megatron-core 0.16.1's optimizers
cannot be built without CUDA). State is saved through ``megatron.core.dist_checkpointing``
(``repro.train.megatron.dist_state``): one folder for all ranks, resumable bit for bit, reshardable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import torch

from repro.devices import current_accelerator
from repro.recipes.backends import TRAINERS
from repro.recipes.schema import Recipe
from repro.train.base import LogprobResult, TrainerError
from repro.train.batch import TrainBatch, micro_batches, padded_to_multiple
from repro.train.batch_checks import check_batch
from repro.train.grpo_trainer import GRPOTrainer
from repro.train.grpo_update import TrainerSettings, UpdateStats
from repro.train.precision import COMPUTE_DTYPES, cast_for_training
from repro.train.megatron.config import ddp_config, megatron_layout, optimizer_config
from repro.train.megatron.optimizers import trainer_optimizer
from repro.train.megatron.parallel import (
    RearmOnBackward, ensure_model_parallel, from_last_stage, join_world, lockstep_over_data_parallel,
    stage_sender, sum_over_data_parallel, vocab_parallel_entropy, vocab_parallel_logprobs,
)
from repro.train.megatron.stream_weights import stage_weights, whole_model_weights
from repro.train.megatron.model import (
    detach_from_global_replay_list, sequence_first, forward_logits, load_weights, moe_routers, weight_state,
)


class MegatronTrainer(GRPOTrainer):
    """GRPO trainer on a megatron-core model, one instance per trainer rank (see the module docstring; its steps:
    ``GRPOTrainer``).

    Args:
        model: this rank's megatron-core ``GPTModel`` (its pipeline stage, TP/EP shard) with MoE layers built with
            ``moe_enable_routing_replay`` (``repro.train.megatron.tiny``; a DSV4 model through
            ``actor.model_provider`` on a cluster).
        settings: what every trainer backend takes from the recipe (``repro.train.grpo_update.TrainerSettings``).
        parallel_state: ``megatron_layout(recipe)["parallel_state"]``; default all 1 (one CPU process).
        export_names: optional ``dict -> dict`` mapping full Megatron weights to the names the rollout serves, e.g.
            ``repro.train.megatron.dsv4_names.megatron_state_to_hf`` for a DSV4 model whose rollout wants HF names.
            Called once per export unit (``repro.train.megatron.stream_weights.export_unit``: one layer's experts
            of one projection, one layer's other tensors, a top-level tensor), never on a whole stage.
    """

    capabilities = TRAINERS["megatron"]

    def __init__(
        self,
        model: torch.nn.Module,
        settings: TrainerSettings,
        *,
        parallel_state: dict[str, int] | None = None,
        export_names: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
        distributed_optimizer: bool = False,
        optimizer_offload: bool = False,
        megatron_optimizer: dict | None = None,
        megatron_ddp: dict | None = None,
    ):
        ensure_model_parallel(parallel_state or dict(
            tensor_model_parallel_size=1, pipeline_model_parallel_size=1, expert_model_parallel_size=1,
            expert_tensor_parallel_size=1, context_parallel_size=1))
        detach_from_global_replay_list(model)
        # the schedule must not divide our losses (each is already its share of the update) and, across pipeline
        # stages, must send each micro-batch's own shape (token-budget micro-batches differ in rows and width)
        model.config.calculate_per_token_loss = True
        model.config.variable_seq_lengths = True
        self.export_names = export_names
        self.settings = settings
        self.optim = settings.optim
        self.grpo = settings.update_rules("megatron")
        dtype = settings.dtype
        self.dtype_name, self.dtype = dtype, COMPUTE_DTYPES[dtype]
        self.max_tokens = settings.max_tokens_per_micro_batch
        self.temperature = settings.temperature
        self.replay_routing = settings.replay_routing
        torch.manual_seed(settings.seed)
        if torch.cuda.is_available():
            # a provider may build on the host (the tiny ones use megatron's use_cpu_initialization, deterministic
            # whatever the device); the rank computes, and megatron's optimizer steps, on its GPU
            model = model.to(current_accelerator())
        self.model = cast_for_training(model, dtype)
        self.routers = moe_routers(model)
        self.opt = trainer_optimizer(
            model, self.optim, distributed=distributed_optimizer, offload=optimizer_offload,
            megatron_optimizer=megatron_optimizer or optimizer_config(
                self.optim, bf16=dtype == "bf16", distributed=distributed_optimizer, offload=optimizer_offload),
            megatron_ddp=megatron_ddp or ddp_config(distributed_optimizer))
        self.opt.zero_grad()
        self.resharded_from: dict[str, int] | None = None  # the layout a resharded load came from
        self.step = 0      # completed train_step calls
        self.updates = 0   # completed optimizer updates (drives the warm-up)

    @classmethod
    def from_recipe(
        cls,
        recipe: Recipe,
        model_provider: Callable[..., torch.nn.Module] | None = None,
        **overrides,
    ) -> "MegatronTrainer":
        """The trainer the recipe describes on this rank; ``model_provider(recipe)`` builds the rank's model once
        model parallelism is initialised (default: ``actor.model_provider``, a ``module:function`` name)."""
        layout = megatron_layout(recipe)
        ensure_model_parallel(layout["parallel_state"])
        provider = model_provider or resolve_model_provider(recipe)
        built = provider(recipe)  # a model, or (model, export_names) when the rollout speaks other names
        model, export_names = built if isinstance(built, tuple) else (built, None)
        changes, own = TrainerSettings.split(overrides)
        own = dict(parallel_state=layout["parallel_state"], export_names=export_names,
                   distributed_optimizer=layout["optimizer"]["use_distributed_optimizer"],
                   optimizer_offload=recipe.actor.optimizer_cpu_offload,
                   megatron_optimizer=layout["optimizer"], megatron_ddp=layout["ddp"], **own)
        return cls(model, TrainerSettings.from_recipe(recipe, **changes), **own)

    @property
    def device(self) -> torch.device:
        """Where this rank's model lives (its GPU on a cluster): each micro-batch is moved there as it is forwarded,
        and results come back to the host."""
        return next(self.model.parameters()).device

    # ---- megatron's forward/backward schedule with R3 ------------------------------------------------------

    def _arm_replay(self, micro: TrainBatch, replay: bool) -> None:
        """Force this stage's routers to ``micro``'s recorded experts (or let them route freely)."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        for layer, r in self.routers.items():
            replay_state = r.module.router_replay
            replay_state.clear_indices()
            if replay:
                replay_state.set_target_indices(
                    sequence_first(micro.routing[layer], self.model.config.sequence_parallel))
                replay_state.replay_backward_list = []  # REPLAY_FORWARD serves recompute too; no second copy
                replay_state.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
            else:
                replay_state.clear_router_replay_action()

    def _schedule(self, micros: list[TrainBatch], replay: bool, score, forward_only: bool) -> None:
        """Run megatron's forward(/backward) schedule over ``micros`` (1F1B across pipeline stages, or plain
        accumulation at PP 1); on the last stage ``score(micro, [b, t, V/tp] logits)`` returns the loss.

        Full recompute re-runs a stage's routers in the backward, after 1F1B may have run later micro-batches'
        forwards: ``RearmOnBackward`` at the stage output re-arms this micro-batch's experts first.
        """
        from megatron.core.pipeline_parallel import get_forward_backward_func

        if not micros:
            return

        device = self.device

        def forward_step(data_iterator, model):
            micro = next(data_iterator).to(device)  # batches are built on the host; one micro-batch at a time moves

            def arm():
                self._arm_replay(micro, replay)

            arm()
            output = forward_logits(model, micro.input_ids)
            if not forward_only and torch.is_grad_enabled():
                output = RearmOnBackward.apply(output, arm)
            return output, lambda out: (score(micro, out), torch.tensor(1, dtype=torch.int), {})

        # train mode only while differentiating: megatron recomputes activations only in training mode
        self.model.train(not forward_only)
        try:
            get_forward_backward_func()(
                forward_step_func=forward_step, data_iterator=iter(micros), model=[self.model],
                num_microbatches=len(micros), seq_length=max(m.input_ids.shape[1] for m in micros),
                micro_batch_size=max(m.input_ids.shape[0] for m in micros), forward_only=forward_only)
        finally:
            self.model.eval()
            self._arm_replay(micros[-1], False)

    @torch.no_grad()
    def logprobs(self, batch: TrainBatch, replay_routing: bool = True) -> LogprobResult:
        """[B, T] log-probs and entropies of the batch's targets at the sampling temperature (0 off-response);
        computed on the last pipeline stage, returned on every rank."""
        check_batch(batch, self.routers, need_old=False, replay=replay_routing, caller="logprobs")
        micros = self._micro_batches(batch)
        scored = []

        def score(micro, logits):
            mask = micro.response_mask
            lp = vocab_parallel_logprobs(logits, micro.targets, self.temperature)
            ent = vocab_parallel_entropy(logits, self.temperature)
            scored.append((torch.where(mask, lp, 0.0).cpu(), torch.where(mask, ent, 0.0).cpu()))
            return lp.new_zeros(())

        self._schedule(micros, replay_routing, score, forward_only=True)
        scored = from_last_stage(scored)
        logprobs = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        entropy = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        start = 0
        for micro, (lp, ent) in zip(micros, scored):
            rows, width = micro.input_ids.shape
            width = min(width, logprobs.shape[1])  # sequence-parallel padding is off-response: zeros
            logprobs[start : start + rows, :width] = lp[:, :width]
            entropy[start : start + rows, :width] = ent[:, :width]
            start += rows
        return LogprobResult(logprobs, entropy)

    def accumulate_gradients(self, batch: TrainBatch, logprobs_out: LogprobResult | None) -> UpdateStats:
        """The hook of ``GRPOTrainer``: the GRPO update's loss over ``batch`` through megatron's schedule, backed
        into the gradients (zeroed first); data-parallel replicas each take their own slice of the forwarded rows.
        pi_old never comes from here (``capabilities.scores_in_update`` is false): ``logprobs_out`` must be None."""
        from megatron.core import parallel_state as ps  # optional heavy dependency: the Megatron lane's venv

        if logprobs_out is not None:
            raise TrainerError("MegatronTrainer.accumulate_gradients: pi_old comes from a separate pass here")

        self.opt.zero_grad()
        stats = UpdateStats()
        plan = self.grpo.plan(batch, stats)
        if plan is not None:
            rows = plan.rows.tensor_split(ps.get_data_parallel_world_size())[ps.get_data_parallel_rank()]

            def score(micro, logits):
                logp = vocab_parallel_logprobs(logits, micro.targets, self.temperature)
                entropy = vocab_parallel_entropy(logits.detach(), self.temperature)
                return self.grpo.micro_loss(micro, logp, entropy, plan, stats)

            micros = lockstep_over_data_parallel(self._micro_batches(batch.rows(rows)), batch)
            self._schedule(micros, self.replay_routing, score, forward_only=False)
        return sum_over_data_parallel(from_last_stage(stats))

    def _micro_batches(self, batch: TrainBatch) -> list[TrainBatch]:
        """Token-budget micro-batches; under sequence parallelism each padded to a width TP divides."""
        from megatron.core import parallel_state as ps

        micros = micro_batches(batch, self.max_tokens) if batch.num_rows else []
        tp = ps.get_tensor_model_parallel_world_size()
        if self.model.config.sequence_parallel and tp > 1:
            micros = [padded_to_multiple(m, tp) for m in micros]
        return micros

    # ---- weights and state ---------------------------------------------------------------------------------

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The whole model's full (world-size-1) weights on rank 0, one at a time -- every stage streamed to its
        first rank (``stage_weights``), later stages forwarded point to point -- as detached CPU copies in the
        trainer's dtype (BF16 for a bf16 recipe), names mapped by ``export_names`` when given; nothing on the
        other ranks. Collective: every rank must call it and walk it to the end. No tensor is pickled."""
        yield from whole_model_weights(self.model, self.dtype, self.export_names)

    def sync_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """What the weight sync sends from this rank: its pipeline stage's full weights on the stage's first rank,
        one tensor at a time, on the model's device (TP/EP shards gathered there per tensor with tensor collectives;
        ``export_names`` applied per export unit, e.g. one layer's experts), nothing elsewhere. Collective over the
        stage: its first rank holds one unit at a time, never the stage (``repro.train.megatron.stream_weights``)."""
        yield from stage_weights(self.model, self.dtype, self.export_names)

    stage_weights = sync_weights  # the name the Megatron lane's tests and benchmarks know it by

    def sync_sender(self) -> int | None:
        """This rank's sender index in the weight sync (its pipeline stage), or None where it only gathers."""
        return stage_sender()

    def save(self, directory: str | Path) -> Path:
        """Model, optimizer state, RNG states and counters of every rank into one folder through megatron's
        dist_checkpointing (collective: every rank passes the same path; replaced atomically)."""
        from repro.train.megatron.dist_state import save_state

        return save_state(self, directory)

    def load(self, directory: str | Path) -> None:
        """Restore what ``save`` wrote (any parallel layout: resharded when it differs), or the per-rank
        safetensors folders of the format before it (the same layout, the project's AdamW only)."""
        from repro.train.megatron.dist_state import load_state, read_meta
        from repro.train.megatron.old_state import load_old_format

        folder = Path(directory)
        meta = read_meta(folder)
        if meta is None:
            load_old_format(self, folder)
        else:
            load_state(self, folder, meta)


def resolve_model_provider(recipe: Recipe) -> Callable[..., torch.nn.Module]:
    """``actor.model_provider`` (``"package.module:function"``) as a callable, or a TrainerError that says what
    to set (the tiny CPU provider, or a DeepSeek-V4 provider on a cluster: docs/megatron-dsv4.md)."""
    import importlib

    name = recipe.actor.model_provider
    if not name:
        raise TrainerError(
            "actor.model_provider is not set: the Megatron backend needs a 'module:function' that builds this "
            "rank's model, e.g. repro.train.megatron.tiny:provider on CPU, or a DeepSeek-V4 provider from "
            "LumenRL's Megatron fork on a cluster (docs/megatron-dsv4.md)"
        )
    module, _, attr = name.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise TrainerError(f"actor.model_provider={name!r} cannot be imported here: {err}") from err


def build_trainer(recipe: Recipe, model_dir: str | Path) -> MegatronTrainer:
    """The trainer of ``repro.recipes.backends.TRAINERS["megatron"]`` on this rank: joins the torch.distributed
    world the group started it in (several ranks), then builds its model from ``actor.model_provider`` (so
    ``model_dir`` is unused)."""
    join_world(recipe.actor.num_workers)  # a lone GPU rank too: megatron's groups need a process group
    return MegatronTrainer.from_recipe(recipe)
