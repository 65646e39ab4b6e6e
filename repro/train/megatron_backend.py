"""The Megatron-core trainer backend: the same GRPO/TIS update as the embedded trainer, on a megatron-core model.

Three parts:

  ``megatron_layout(recipe)``   pure: the recipe's actor/optim/routing sections -> keyword arguments of
                                ``parallel_state.initialize_model_parallel``, ``TransformerConfig``,
                                ``OptimizerConfig`` and ``DistributedDataParallelConfig`` (AMD: TP4/PP4/EP4/ETP1,
                                sequence parallel, full recompute, bf16, distributed optimizer offloaded to CPU).
                                No megatron import, no process group: tested as plain dicts.
  ``build_tiny_gpt_moe``        a tiny megatron-core ``GPTModel`` with MoE layers (router + shared expert) from the
                                local layer spec -- megatron-core has no DeepSeek-V4 layers; on a cluster a DSV4
                                layer spec comes in through ``model_provider`` (docs/megatron-dsv4.md).
  ``MegatronTrainer``           the ``Trainer`` protocol. The update loop (decoupled TIS weights fixed up front,
                                zero-advantage rows skipped but counted, token-budget micro-batches each weighted by
                                its share of the update's normaliser, global-norm clip, fp32-master AdamW with
                                warm-up) is inherited from ``EmbeddedTrainer`` unchanged, so both backends compute
                                the one loss of ``repro.algos``; this class supplies the model, the forward with R3
                                through megatron-core's own ``RouterReplay`` and the state on disk.

R3 on megatron-core 0.16.1: with ``moe_enable_routing_replay`` every ``TopKRouter`` owns a ``RouterReplay``.
``REPLAY_FORWARD`` makes its top-k return the given indices with probabilities gathered from this forward's own
scores, so the router weight keeps its gradient; ``RECORD`` stores what the router chose. The trainer drives each
router's instance directly (never megatron's process-global list, which every model built in the process joins)
and leaves the replay armed until the next forward, so a full-recompute backward re-runs the same experts.
Megatron routes a ``[seq * batch]`` token order (sequence first), so ``[B, T, k]`` tables are transposed.

At world size 1 on CPU (tests) ``repro.train.megatron_shim`` patches megatron-core's CUDA assumptions, every
parallel size is 1 and the optimizer is the project's fp32-master AdamW (``MasterAdamW``, the same update Megatron's
mixed-precision optimizer does): megatron-core 0.16.1's optimizers allocate on ``device="cuda"`` outright
(``FP32Optimizer._scale``, ``MixedPrecisionOptimizer._dummy_overflow_buf``), so they cannot be built on CPU. On a cluster ``megatron_layout(...)["optimizer"]`` is the ``OptimizerConfig`` for
``get_megatron_optimizer`` and pipeline stages need megatron's forward/backward schedule -- not wired here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from repro.config import AlgorithmConfig, OptimConfig, Recipe, RolloutCorrectionConfig
from repro.train.base import TrainerError
from repro.train.batch import TrainBatch
from repro.train.embedded import EmbeddedTrainer



# ---- recipe -> megatron configuration (pure) ---------------------------------------------------------------


def megatron_layout(recipe: Recipe) -> dict[str, dict[str, Any]]:
    """Keyword arguments, per megatron-core constructor, that the recipe's trainer section implies.

    Keys: ``parallel_state`` (``initialize_model_parallel``), ``transformer`` (parallel/recompute/precision/MoE
    fields of ``TransformerConfig``; the architecture comes from the model provider), ``optimizer``
    (``OptimizerConfig``), ``ddp`` (``DistributedDataParallelConfig``). Pure: reads the recipe, returns dicts.
    """
    actor, optim = recipe.actor, recipe.optim
    bf16 = actor.dtype == "bf16"
    multi_rank = actor.num_workers > 1
    ep = actor.expert_parallel
    parallel_state = {
        "tensor_model_parallel_size": actor.tensor_parallel,
        "pipeline_model_parallel_size": actor.pipeline_parallel,
        "expert_model_parallel_size": ep,
        "expert_tensor_parallel_size": actor.expert_tensor_parallel,
        "context_parallel_size": 1,
    }
    full = actor.recompute == "full"
    transformer = {
        "tensor_model_parallel_size": actor.tensor_parallel,
        "pipeline_model_parallel_size": actor.pipeline_parallel,
        "expert_model_parallel_size": ep,
        "expert_tensor_parallel_size": actor.expert_tensor_parallel,
        # Megatron only allows sequence parallelism with TP > 1 (it splits the sequence across the TP group).
        "sequence_parallel": actor.sequence_parallel and actor.tensor_parallel > 1,
        "recompute_granularity": "full" if full else None,
        "recompute_method": "uniform" if full else None,
        "recompute_num_layers": 1 if full else None,
        "bf16": bf16,
        "params_dtype": torch.bfloat16 if bf16 else torch.float32,
        # activations sent between pipeline stages (megatron requires it once PP > 1)
        "pipeline_dtype": (torch.bfloat16 if bf16 else torch.float32) if actor.pipeline_parallel > 1 else None,
        "num_moe_experts": recipe.model.num_routed_experts,
        "moe_router_topk": recipe.model.num_experts_per_tok,
        "moe_enable_routing_replay": recipe.routing_replay.enabled,
        # alltoall moves only the routed tokens between EP ranks; allgather is the one that runs on CPU at EP1
        "moe_token_dispatcher_type": "alltoall" if ep > 1 else "allgather",
        "moe_router_load_balancing_type": "none",  # GRPO fine-tuning: no aux loss (kl/entropy/aux all 0)
        "moe_aux_loss_coeff": 0.0,
    }
    optimizer = {
        "optimizer": "adam",
        "lr": optim.lr,
        "min_lr": optim.lr,  # constant schedule
        "weight_decay": optim.weight_decay,
        "adam_beta1": optim.betas[0],
        "adam_beta2": optim.betas[1],
        "adam_eps": optim.eps,
        "clip_grad": optim.grad_clip,
        "bf16": bf16,
        "params_dtype": torch.bfloat16 if bf16 else torch.float32,
        "use_distributed_optimizer": multi_rank,
        "optimizer_cpu_offload": actor.optimizer_cpu_offload,
        "optimizer_offload_fraction": 1.0 if actor.optimizer_cpu_offload else 0.0,
        "overlap_cpu_optimizer_d2h_h2d": actor.optimizer_cpu_offload,
        # megatron's HybridDeviceOptimizer (CPU offload) runs through the precision-aware path
        "use_precision_aware_optimizer": actor.optimizer_cpu_offload and multi_rank,
    }
    ddp = {
        "use_distributed_optimizer": multi_rank,
        "grad_reduce_in_fp32": True,
        "overlap_grad_reduce": False,
        "overlap_param_gather": False,
    }
    return {"parallel_state": parallel_state, "transformer": transformer, "optimizer": optimizer, "ddp": ddp}


# ---- the tiny megatron-core MoE model ------------------------------------------------------------------------


@dataclass(frozen=True)
class TinyGPTMoE:
    """Sizes of the tiny GPT/MoE the CPU tests train (vocab of the tiny tokenizer, 8 experts top-2 like tiny DSV4)."""

    vocab_size: int = 25
    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    ffn_hidden_size: int = 128
    num_moe_experts: int = 8
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int = 64
    moe_shared_expert_intermediate_size: int = 64
    max_sequence_length: int = 256


def tiny_transformer_config(spec: TinyGPTMoE = TinyGPTMoE(), **overrides):
    """``TransformerConfig`` of the tiny model: sigmoid router scores renormalised over the top-k and scaled 1.5
    (DSV4's shape of routing), no biases, SwiGLU experts, RMSNorm, routing replay on, no fused CUDA kernels."""
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    settings = dict(
        num_layers=spec.num_layers, hidden_size=spec.hidden_size, num_attention_heads=spec.num_attention_heads,
        ffn_hidden_size=spec.ffn_hidden_size, num_moe_experts=spec.num_moe_experts,
        moe_router_topk=spec.moe_router_topk, moe_ffn_hidden_size=spec.moe_ffn_hidden_size,
        moe_shared_expert_intermediate_size=spec.moe_shared_expert_intermediate_size,
        moe_token_dispatcher_type="allgather", moe_router_score_function="sigmoid",
        moe_router_topk_scaling_factor=1.5, moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
        moe_enable_routing_replay=True, add_bias_linear=False, gated_linear_unit=True, activation_func=F.silu,
        normalization="RMSNorm", hidden_dropout=0.0, attention_dropout=0.0, params_dtype=torch.float32,
        use_cpu_initialization=True, bias_activation_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, persist_layer_norm=False, gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
    )
    return TransformerConfig(**{**settings, **overrides})


def build_tiny_gpt_moe(seed: int = 0, spec: TinyGPTMoE = TinyGPTMoE(), **config_overrides) -> torch.nn.Module:
    """A freshly initialised tiny megatron-core ``GPTModel`` (fp32, deterministic in ``seed``).

    Needs model parallelism initialised (``ensure_model_parallel``); on CPU that installs the shim first.
    """
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    ensure_model_parallel(dict(tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                               expert_model_parallel_size=1, expert_tensor_parallel_size=1, context_parallel_size=1))
    torch.manual_seed(seed)
    _seed_rng_tracker(seed)
    config = tiny_transformer_config(spec, **config_overrides)
    layer_spec = get_gpt_layer_local_spec(num_experts=spec.num_moe_experts, moe_grouped_gemm=False,
                                          normalization="RMSNorm")
    model = GPTModel(config=config, transformer_layer_spec=layer_spec, vocab_size=spec.vocab_size,
                     max_sequence_length=spec.max_sequence_length, position_embedding_type="rope",
                     share_embeddings_and_output_weights=False)
    _detach_from_global_replay_list(model)
    return model.eval()


def _seed_rng_tracker(seed: int) -> None:
    if torch.cuda.is_available():
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(seed)
    else:
        from repro.train.megatron_shim import seed_model_parallel_rng

        seed_model_parallel_rng(seed)


def ensure_model_parallel(parallel_state_kwargs: dict[str, int]) -> None:
    """Initialise megatron's model-parallel groups with these sizes, or check that the live ones match."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if not torch.cuda.is_available():
        from repro.train.megatron_shim import install_cpu_shim

        install_cpu_shim()
    elif not dist.is_initialized():
        raise TrainerError("MegatronTrainer: torch.distributed is not initialised (start the workers with torchrun/Ray)")
    sizes = {k: int(v) for k, v in parallel_state_kwargs.items()}
    if parallel_state.model_parallel_is_initialized():
        live = {
            "tensor_model_parallel_size": parallel_state.get_tensor_model_parallel_world_size(),
            "pipeline_model_parallel_size": parallel_state.get_pipeline_model_parallel_world_size(),
            "expert_model_parallel_size": parallel_state.get_expert_model_parallel_world_size(),
            "expert_tensor_parallel_size": parallel_state.get_expert_tensor_parallel_world_size(),
            "context_parallel_size": parallel_state.get_context_parallel_world_size(),
        }
        wrong = {k: (sizes[k], live[k]) for k in live if k in sizes and sizes[k] != live[k]}
        if wrong:
            raise TrainerError(f"MegatronTrainer: model parallelism is already initialised differently (want, live): {wrong}")
        return
    world = dist.get_world_size()
    model_parallel = sizes["tensor_model_parallel_size"] * sizes["pipeline_model_parallel_size"] * sizes["context_parallel_size"]
    if world % model_parallel:
        raise TrainerError(
            f"actor.tensor_parallel x actor.pipeline_parallel = {model_parallel} does not divide the world size {world}"
        )
    parallel_state.initialize_model_parallel(**sizes)


def _detach_from_global_replay_list(model: torch.nn.Module) -> None:
    """Drop this model's routers from megatron's process-global ``RouterReplay`` list (the trainer drives each
    instance itself; the global list would otherwise mix every model built in the process)."""
    from megatron.core.transformer.moe.router_replay import RouterReplay

    mine = {id(m.router_replay) for m in model.modules() if getattr(m, "router_replay", None) is not None}
    RouterReplay.global_router_replay_instances[:] = [
        r for r in RouterReplay.global_router_replay_instances if id(r) not in mine
    ]


@dataclass
class _Router:
    """One top-k MoE router of the model: what ``check_batch`` reads (``top_k``) plus the megatron module."""

    module: torch.nn.Module
    top_k: int
    num_experts: int


def moe_routers(model: torch.nn.Module) -> dict[int, _Router]:
    """Global layer index (0-based) -> top-k router of every MoE layer with routing replay enabled."""
    from megatron.core.transformer.moe.router import TopKRouter

    routers = {}
    for layer in model.decoder.layers:
        router = getattr(getattr(layer, "mlp", None), "router", None)
        if isinstance(router, TopKRouter):
            if router.router_replay is None:
                raise TrainerError(f"layer {layer.layer_number - 1}: router built without moe_enable_routing_replay")
            routers[layer.layer_number - 1] = _Router(router, router.topk, router.config.num_moe_experts)
    if not routers:
        raise TrainerError(f"{type(model).__name__} has no megatron TopKRouter (no MoE layer to route)")
    return routers


def _model_inputs(input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    rows, width = input_ids.shape
    position_ids = torch.arange(width, device=input_ids.device).unsqueeze(0).expand(rows, width)
    # megatron's default causal mask is allocated on "cuda"; an explicit one (True = masked) works anywhere
    causal = torch.triu(torch.ones(width, width, dtype=torch.bool, device=input_ids.device), diagonal=1)
    return {"input_ids": input_ids, "position_ids": position_ids, "attention_mask": causal[None, None]}


def forward_logits(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """[B, T, V] logits of a megatron ``GPTModel`` (causal, positions 0..T-1)."""
    return model(**_model_inputs(input_ids))


def _sequence_first(table: torch.Tensor, sequence_parallel: bool) -> torch.Tensor:
    """[B, T, k] -> megatron's [T * B, k] token order, this rank's sequence chunk under sequence parallelism."""
    from megatron.core import parallel_state

    k = table.shape[-1]
    per_token = table.transpose(0, 1)
    tp = parallel_state.get_tensor_model_parallel_world_size()
    if sequence_parallel and tp > 1:
        # under SP each TP rank routes its own T/tp slice of the sequence (untested at world size 1)
        per_token = per_token.chunk(tp, dim=0)[parallel_state.get_tensor_model_parallel_rank()]
    return per_token.reshape(-1, k).contiguous()


def record_routing(model: torch.nn.Module, input_ids: torch.Tensor) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """One forward with every router recording: ([B, T, V] logits, layer -> [B, T, top_k] int64 experts)."""
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    routers = moe_routers(model)
    for r in routers.values():
        r.module.router_replay.clear_indices()
        r.module.router_replay.set_router_replay_action(RouterReplayAction.RECORD)
    try:
        logits = forward_logits(model, input_ids)
        rows, width = input_ids.shape
        indices = {}
        for layer, r in routers.items():
            recorded = r.module.router_replay.get_recorded_indices()
            indices[layer] = recorded.detach().view(width, rows, -1).transpose(0, 1).to(torch.int64).contiguous()
    finally:
        for r in routers.values():
            r.module.router_replay.clear_router_replay_action()
            r.module.router_replay.clear_indices()
    return logits, indices


def weight_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict without megatron's ``_extra_state`` entries (None or bytes, not weights)."""
    return {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor) and not k.endswith("_extra_state")}


def load_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], source: str = "weights") -> None:
    """Load ``weight_state``-style tensors into ``model``: every weight must be present and known."""
    missing = sorted(set(weight_state(model)) - set(weights))
    unknown = sorted(set(weights) - set(weight_state(model)))
    if missing or unknown:
        raise TrainerError(f"{source} does not fit the model: missing {missing[:3]}, unknown {unknown[:3]}")
    try:
        model.load_state_dict(weights, strict=False)
    except RuntimeError as err:
        raise TrainerError(f"{source} does not fit the model: {err}") from err


# ---- the trainer -------------------------------------------------------------------------------------------


class MegatronTrainer(EmbeddedTrainer):
    """GRPO trainer on a megatron-core model (see the module docstring).

    Args:
        model: a megatron-core ``GPTModel`` with MoE layers built with ``moe_enable_routing_replay`` (e.g.
            ``build_tiny_gpt_moe``; a DSV4 model through ``model_provider`` on a cluster).
        parallel_state: ``megatron_layout(recipe)["parallel_state"]``; default all 1 (one CPU process).
        export_names: optional ``dict -> dict`` applied to the weights ``named_weights`` yields, e.g.
            ``repro.train.dsv4_names.megatron_state_to_hf`` for a DSV4 model whose rollout wants HF names.
        The other arguments are the embedded trainer's.
    """

    def __init__(
        self,
        model: torch.nn.Module,
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
        parallel_state: dict[str, int] | None = None,
        export_names: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
    ):
        ensure_model_parallel(parallel_state or dict(
            tensor_model_parallel_size=1, pipeline_model_parallel_size=1, expert_model_parallel_size=1,
            expert_tensor_parallel_size=1, context_parallel_size=1))
        self.export_names = export_names
        self._setup(model, moe_routers, "megatron", optim=optim, algorithm=algorithm,
                    rollout_correction=rollout_correction, dtype=dtype, max_tokens=max_tokens_per_micro_batch,
                    temperature=temperature, replay_routing=replay_routing,
                    skip_zero_advantage_rows=skip_zero_advantage_rows, seed=seed)

    @classmethod
    def from_recipe(
        cls,
        recipe: Recipe,
        model_provider: Callable[[], torch.nn.Module] | None = None,
        **overrides,
    ) -> "MegatronTrainer":
        """The trainer the recipe describes; ``model_provider()`` builds the model after model parallelism is
        initialised (default: the tiny GPT/MoE, CPU tests only)."""
        layout = megatron_layout(recipe)
        ensure_model_parallel(layout["parallel_state"])
        model = (model_provider or (lambda: build_tiny_gpt_moe(seed=recipe.seed)))()
        settings = dict(
            optim=recipe.optim,
            algorithm=recipe.algorithm,
            rollout_correction=recipe.rollout_correction,
            dtype=recipe.actor.dtype,
            max_tokens_per_micro_batch=recipe.actor.max_tokens_per_micro_batch,
            temperature=recipe.rollout.temperature,
            replay_routing=recipe.routing_replay.enabled,
            seed=recipe.seed,
            parallel_state=layout["parallel_state"],
        )
        return cls(model, **{**settings, **overrides})

    # ---- forward with R3 -----------------------------------------------------------------------------------

    def _forward(self, micro: TrainBatch, replay: bool) -> torch.Tensor:
        """[b, t, V] logits; with ``replay`` every router is forced to the micro-batch's recorded experts.

        The replay stays armed after the forward so a full-recompute backward re-runs the same experts; the next
        forward re-arms or disarms it.
        """
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        for layer, r in self.routers.items():
            replay_state = r.module.router_replay
            replay_state.clear_indices()
            if replay:
                replay_state.set_target_indices(_sequence_first(micro.routing[layer], self.model.config.sequence_parallel))
                replay_state.replay_backward_list = []  # REPLAY_FORWARD serves recompute too; no second copy
                replay_state.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
            else:
                replay_state.clear_router_replay_action()
        # train mode only while differentiating: megatron recomputes activations only in training mode
        self.model.train(torch.is_grad_enabled())
        try:
            return forward_logits(self.model, micro.input_ids)
        finally:
            self.model.eval()

    # ---- weights and state ---------------------------------------------------------------------------------

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every weight (parameters and persistent buffers, not megatron's ``_extra_state``), detached CPU copies
        in the trainer's dtype (BF16 for a bf16 recipe); names mapped by ``export_names`` when given."""
        weights = {}
        for name, tensor in weight_state(self.model).items():
            tensor = tensor.detach().to("cpu")
            if tensor.is_floating_point():
                tensor = tensor.to(self.dtype)
            weights[name] = tensor.clone()
        if self.export_names is not None:
            weights = self.export_names(weights)
        yield from weights.items()

    def save(self, directory: str | Path) -> Path:
        """Weights, fp32 masters (bf16), AdamW state, RNG and counters to ``directory`` (replaced atomically)."""
        from repro.train.state import save_trainer

        return save_trainer(self, directory, backend="megatron", weights=weight_state(self.model), hf_config=False)

    def load(self, directory: str | Path) -> None:
        from repro.train.state import load_trainer

        load_trainer(self, directory, backend="megatron",
                     load_weights=lambda weights, source: load_weights(self.model, weights, source))
