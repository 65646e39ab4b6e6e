"""Recipe -> megatron-core configuration, as plain keyword dicts (no megatron import, no process group)."""

from __future__ import annotations

from typing import Any

import torch

from repro.recipes.backends import precision_aware_optimizer
from repro.recipes.schema import OptimConfig, Recipe


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
    uneven = actor.pipeline_parallel > 1
    moments = torch.bfloat16 if actor.optimizer_moment_dtype == "bf16" else torch.float32
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
        # uneven stages (LumenRL: Flash's 43 layers as 11/11/11/10); validated by repro.recipes.consistency
        "num_layers_in_first_pipeline_stage": actor.num_layers_in_first_pipeline_stage if uneven else None,
        "num_layers_in_last_pipeline_stage": actor.num_layers_in_last_pipeline_stage if uneven else None,
        "num_moe_experts": recipe.model.num_routed_experts,
        "moe_router_topk": recipe.model.num_experts_per_tok,
        "moe_enable_routing_replay": recipe.routing_replay.enabled,
        # alltoall moves only the routed tokens between EP ranks; allgather is the one that runs on CPU at EP1
        "moe_token_dispatcher_type": "alltoall" if ep > 1 else "allgather",
        "moe_router_load_balancing_type": "none",  # GRPO fine-tuning: no aux loss (kl/entropy/aux all 0)
        "moe_aux_loss_coeff": 0.0,
    }
    optimizer = optimizer_config(optim, bf16=bf16, distributed=multi_rank, offload=actor.optimizer_cpu_offload,
                                 offload_fraction=actor.optimizer_offload_fraction, moments=moments)
    ddp = ddp_config(multi_rank)
    return {"parallel_state": parallel_state, "transformer": transformer, "optimizer": optimizer, "ddp": ddp}


def ddp_config(distributed: bool) -> dict[str, Any]:
    """``DistributedDataParallelConfig`` keyword arguments: fp32 gradient reduction, no overlap (one bucket)."""
    return {
        "use_distributed_optimizer": distributed,
        "grad_reduce_in_fp32": True,
        "overlap_grad_reduce": False,
        "overlap_param_gather": False,
    }


def optimizer_config(optim: OptimConfig, *, bf16: bool, distributed: bool, offload: bool, offload_fraction: float = 1.0,
                     moments: torch.dtype = torch.float32) -> dict[str, Any]:
    """``OptimizerConfig`` keyword arguments for the recipe's AdamW (constant lr: warm-up is set per update)."""
    return {
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
        "use_distributed_optimizer": distributed,
        "optimizer_cpu_offload": offload,
        "optimizer_offload_fraction": offload_fraction if offload else 0.0,
        "overlap_cpu_optimizer_d2h_h2d": offload,
        # megatron's HybridDeviceOptimizer (CPU offload) and moments below fp32 both run through the
        # precision-aware path, which megatron allows only with the distributed optimizer
        "use_precision_aware_optimizer": precision_aware_optimizer(distributed, offload, moments == torch.float32),
        # BF16 moments as LumenRL's DSV4 config keeps them. megatron-core 0.16.1 hands these to the GPU Adam only:
        # its HybridDeviceOptimizer (optimizer_cpu_offload) builds torch's Adam without them, so offloaded moments
        # stay fp32 there (repro.readiness.memory_budget counts them so)
        "exp_avg_dtype": moments,
        "exp_avg_sq_dtype": moments,
    }
