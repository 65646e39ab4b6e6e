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
    assert (o["adam_beta1"], o["adam_beta2"], o["adam_eps"], o["weight_decay"], o["clip_grad"]) == (0.9, 0.98, 1e-8, 0.1, 1.0)
    assert o["use_distributed_optimizer"] is True and layout["ddp"]["use_distributed_optimizer"] is True
    assert o["optimizer_cpu_offload"] is True and o["optimizer_offload_fraction"] == 1.0
    assert o["bf16"] is True


def test_cpu_recipe_maps_to_everything_one_and_off():
    layout = megatron_layout(load_recipe("tiny-cpu", ["actor.dtype=fp32"]))  # the CPU lane trains Megatron in fp32
    assert set(layout["parallel_state"].values()) == {1}
    t, o = layout["transformer"], layout["optimizer"]
    assert t["sequence_parallel"] is False and t["recompute_granularity"] is None
    assert t["bf16"] is False and t["moe_token_dispatcher_type"] == "allgather"
    assert o["use_distributed_optimizer"] is False and o["optimizer_cpu_offload"] is False


def test_megatron_accepts_the_mapped_configs():
    pytest.importorskip("megatron.core", reason="megatron-core is not installed here: `make test-megatron` runs this")
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    layout = megatron_layout(load_recipe("amd-dsv4-flash-mi308x"))
    # architecture placeholders: TransformerConfig validates the parallel fields against them (no process group)
    config = TransformerConfig(num_layers=8, hidden_size=256, num_attention_heads=8, moe_ffn_hidden_size=64,
                               add_bias_linear=False, **layout["transformer"])
    assert config.sequence_parallel and config.recompute_granularity == "full"
    settings = dict(layout["optimizer"])
    assert settings["use_precision_aware_optimizer"] is True
    if importlib.util.find_spec("transformer_engine") is None:
        # OptimizerConfig asks Transformer Engine's version on the precision-aware path; TE is a GPU-only install
        settings["use_precision_aware_optimizer"] = False
    optimizer = OptimizerConfig(**settings)
    assert optimizer.use_distributed_optimizer and optimizer.optimizer_cpu_offload
    assert DistributedDataParallelConfig(**layout["ddp"]).use_distributed_optimizer
