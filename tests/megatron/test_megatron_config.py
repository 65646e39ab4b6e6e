"""Recipe -> megatron-core configuration, a pure mapping: checked as plain dicts (runs without megatron, in the main
`make test` too), then fed to megatron's own TransformerConfig/OptimizerConfig validation where megatron exists."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from repro.recipes import load_recipe
from repro.train.megatron.config import megatron_layout


def test_amd_recipe_maps_to_tp4_pp4_ep4_etp1_sp_full_recompute_distributed_offloaded_optimizer():
    recipe = load_recipe("amd-dsv4-flash-mi308x")
    layout = megatron_layout(recipe)
    assert layout["parallel_state"] == {
        "tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 4, "expert_model_parallel_size": 4,
        "expert_tensor_parallel_size": 1, "context_parallel_size": 1,
    }
    t = layout["transformer"]
    assert (t["tensor_model_parallel_size"], t["pipeline_model_parallel_size"], t["expert_model_parallel_size"],
            t["expert_tensor_parallel_size"]) == (4, 4, 4, 1)
    assert t["sequence_parallel"] is True
    assert (t["recompute_granularity"], t["recompute_method"], t["recompute_num_layers"]) == ("full", "uniform", 1)
    assert t["bf16"] is True and t["params_dtype"] is torch.bfloat16 and t["pipeline_dtype"] is torch.bfloat16
    assert (t["num_moe_experts"], t["moe_router_topk"]) == (256, 6)
    assert t["moe_enable_routing_replay"] is True and t["moe_token_dispatcher_type"] == "alltoall"
    o = layout["optimizer"]
    assert o["optimizer"] == "adam" and o["lr"] == o["min_lr"] == 1e-6
    assert (o["adam_beta1"], o["adam_beta2"], o["adam_eps"], o["weight_decay"], o["clip_grad"]) == \
        (0.9, 0.98, 1e-8, 0.1, 1.0)
    assert o["use_distributed_optimizer"] is True and layout["ddp"]["use_distributed_optimizer"] is True
    assert o["optimizer_cpu_offload"] is True and o["optimizer_offload_fraction"] == 1.0
    assert o["bf16"] is True
    # LumenRL's DSV4 config: BF16 moments (precision-aware path) and Flash's 43 layers as 11/11/11/10
    assert o["exp_avg_dtype"] is torch.bfloat16 and o["exp_avg_sq_dtype"] is torch.bfloat16
    assert o["use_precision_aware_optimizer"] is True
    assert (t["num_layers_in_first_pipeline_stage"], t["num_layers_in_last_pipeline_stage"]) == (11, 10)


def test_offload_fraction_and_moment_dtype_follow_the_recipe():
    half = megatron_layout(load_recipe("amd-dsv4-flash-mi308x", ["actor.optimizer_offload_fraction=0.5"]))["optimizer"]
    assert half["optimizer_offload_fraction"] == 0.5
    kept = megatron_layout(load_recipe("amd-dsv4-flash-mi308x", ["actor.optimizer_cpu_offload=false",
                                                                  "actor.optimizer_moment_dtype=fp32"]))["optimizer"]
    assert kept["optimizer_offload_fraction"] == 0.0 and kept["exp_avg_dtype"] is torch.float32
    assert kept["use_precision_aware_optimizer"] is False  # fp32 moments on the device: megatron's plain path
    bf16_on_device = megatron_layout(load_recipe("amd-dsv4-flash-mi308x", ["actor.optimizer_cpu_offload=false"]))
    assert bf16_on_device["optimizer"]["use_precision_aware_optimizer"] is True
    even = megatron_layout(load_recipe("amd-dsv4-flash-mi308x", ["actor.num_layers_in_first_pipeline_stage=null",
                                                                  "actor.num_layers_in_last_pipeline_stage=null",
                                                                  "model.num_layers=44"]))["transformer"]
    assert even["num_layers_in_first_pipeline_stage"] is None and even["num_layers_in_last_pipeline_stage"] is None


def test_cpu_recipe_maps_to_everything_one_and_off():
    layout = megatron_layout(load_recipe("tiny-cpu", ["actor.dtype=fp32"]))  # the CPU lane trains Megatron in fp32
    assert set(layout["parallel_state"].values()) == {1}
    t, o = layout["transformer"], layout["optimizer"]
    assert t["sequence_parallel"] is False and t["recompute_granularity"] is None
    assert t["bf16"] is False and t["moe_token_dispatcher_type"] == "allgather"
    assert o["use_distributed_optimizer"] is False and o["optimizer_cpu_offload"] is False
    assert o["exp_avg_dtype"] is torch.float32 and t["num_layers_in_first_pipeline_stage"] is None


def test_megatron_accepts_the_mapped_configs(monkeypatch):
    pytest.importorskip("megatron.core", reason="megatron-core is not installed here: `make test-megatron` runs this")
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, optimizer_config
    from megatron.core.transformer.transformer_config import TransformerConfig

    recipe = load_recipe("amd-dsv4-flash-mi308x")
    layout = megatron_layout(recipe)
    # architecture placeholders but the recipe's 43 layers: TransformerConfig checks the 11/11/11/10 split against
    # them with megatron's own uneven-pipeline rules (no process group)
    config = TransformerConfig(num_layers=recipe.model.num_layers, hidden_size=256, num_attention_heads=8,
                               moe_ffn_hidden_size=64, add_bias_linear=False, **layout["transformer"])
    assert config.sequence_parallel and config.recompute_granularity == "full"
    assert (config.num_layers_in_first_pipeline_stage, config.num_layers_in_last_pipeline_stage) == (11, 10)
    with pytest.raises(ValueError, match="middle"):  # megatron refuses a split the recipe check also refuses
        TransformerConfig(num_layers=44, hidden_size=256, num_attention_heads=8, moe_ffn_hidden_size=64,
                          add_bias_linear=False, **layout["transformer"])
    if importlib.util.find_spec("transformer_engine") is None:
        # Stand-in for Transformer Engine's version answer only: OptimizerConfig asks TE's version on the precision-
        # aware path (BF16 moments need it) and TE is a GPU-only install. With CPU offload it returns before
        # importing TE's FusedAdam, so every other check below is megatron's own.
        monkeypatch.setattr(optimizer_config, "is_te_min_version", lambda version, check_equality=True: True)
    optimizer = OptimizerConfig(**layout["optimizer"])
    assert optimizer.use_distributed_optimizer and optimizer.optimizer_cpu_offload
    assert optimizer.use_precision_aware_optimizer and optimizer.optimizer_offload_fraction == 1.0
    assert optimizer.exp_avg_dtype is torch.bfloat16 and optimizer.exp_avg_sq_dtype is torch.bfloat16
    assert (optimizer.lr, optimizer.adam_beta2, optimizer.weight_decay) == (1e-6, 0.98, 0.1)
    assert DistributedDataParallelConfig(**layout["ddp"]).use_distributed_optimizer
    # the same moments without the precision-aware path are refused by megatron itself
    with pytest.raises(AssertionError, match="exp_avg_dtype"):
        OptimizerConfig(**{**layout["optimizer"], "use_precision_aware_optimizer": False})


def test_without_transformer_engine_megatron_cannot_configure_amds_optimizer():
    """Why `repro check`, `repro launch` and MegatronTrainer name Transformer Engine for this recipe: megatron-core
    0.16.1's OptimizerConfig asks TE's version on the precision-aware path before its CPU-offload early return."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed here: `make test-megatron` runs this")
    if importlib.util.find_spec("transformer_engine") is not None:
        pytest.skip("Transformer Engine is installed here")
    from megatron.core.optimizer import OptimizerConfig

    from repro.recipes.backends import TRANSFORMER_ENGINE, libraries

    recipe = load_recipe("amd-dsv4-flash-mi308x")
    with pytest.raises(TypeError, match="NoneType"):
        OptimizerConfig(**megatron_layout(recipe)["optimizer"])
    assert TRANSFORMER_ENGINE in libraries(recipe)
    assert TRANSFORMER_ENGINE not in libraries(load_recipe("amd-dsv4-flash-mi308x",
                                                           ["actor.optimizer_cpu_offload=false",
                                                            "actor.optimizer_moment_dtype=fp32"]))
