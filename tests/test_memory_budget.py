"""The trainer's memory budget (repro.readiness.memory_budget): exact bytes on a hand-made small layout, the AMD
recipe fitting its MI308X devices, the same recipe without offload flagged naming the field, and the dry run and
`repro check` showing the same numbers."""

from __future__ import annotations

import pytest

from repro.cluster.placement import plan_placement
from repro.readiness import checks as C
from repro.readiness.memory_budget import format_budget, memory_budget, optimizer_bytes
from repro.recipes import load_recipe
from repro.recipes.consistency import pipeline_stage_layers
from repro.run.launch import format_dry_run, unplaced_rows
from repro.errors import RecipeError

from test_cluster_checks import amd_cluster_facts, laptop_facts

# 4 layers of 40 dense + 100 expert parameters, an 8-wide hidden state, a 10-token vocabulary (80-parameter tables)
SMALL = ["model.num_layers=4", "model.hidden_size=8", "model.vocab_size=10", "model.residual_streams=1",
         "model.num_expert_parameters=400", "model.num_parameters=720", "actor.num_workers=8", "actor.nodes=2",
         "actor.tensor_parallel=2", "actor.pipeline_parallel=2", "actor.expert_parallel=2",
         "actor.num_layers_in_first_pipeline_stage=null", "actor.num_layers_in_last_pipeline_stage=null",
         "actor.max_tokens_per_micro_batch=16", "weight_sync.bucket_mb=1"]


def test_small_layout_exact_bytes_per_rank_and_node():
    recipe = load_recipe("amd-dsv4-flash-mi308x", SMALL)
    budget = memory_budget(recipe)
    assert [s.layers for s in budget.stages] == [2, 2]
    # held: (2 x 40 dense + 80 table) / TP 2 + 2 x 100 experts / EP 2 = 180; optimizer state over DP 2 and EDP 2: 90
    assert [s.parameters for s in budget.stages] == [180, 180]
    first, last = budget.stages
    sync = 2 * 1024**2 + 10 * 8 * 2  # two 1 MiB buckets + the bf16 embedding gathered whole
    # activations: kept inputs (PP - stage) x 2 layers x 16 tokens x 8 x 1 stream x 2 bytes / TP 2 (sequence
    # parallel), one layer's working set 34 x 16 x 8 / 2 = 2176, the last stage's fp32 logits + grad 2 x 16 x 10 / 2 x 4
    assert first.device == {"weights": 360, "gradients": 720, "optimizer state": 0,
                            "activations": 512 + 2176, "weight-sync buckets": sync}
    assert last.device == {"weights": 360, "gradients": 720, "optimizer state": 0,
                           "activations": 256 + 2176 + 640, "weight-sync buckets": sync}
    # megatron-core's offloaded share: fp32 master 4 + fp32 moments 8 + fp32 gradient copy 4 per owned parameter
    assert first.host == last.host == {"optimizer state": 90 * 16}
    assert budget.node_host == [4 * 1440, 4 * 1440]  # 4 ranks per node, node 0 = stage 0, node 1 = stage 1
    assert budget.problems == []
    # on the device instead: fp32 master + the recipe's bf16 moments, 8 bytes per owned parameter
    kept = memory_budget(load_recipe("amd-dsv4-flash-mi308x", SMALL + ["actor.optimizer_cpu_offload=false"]))
    assert [s.device["optimizer state"] for s in kept.stages] == [720, 720]
    assert kept.node_host == [0, 0]
    half = memory_budget(load_recipe("amd-dsv4-flash-mi308x", SMALL + ["actor.optimizer_offload_fraction=0.5"]))
    assert half.stages[0].device["optimizer state"] == 360 and half.stages[0].host["optimizer state"] == 720
    # judged against capacities: exactly enough fits, one byte less flags the last stage naming the field
    assert memory_budget(recipe, device_bytes=last.device_total).problems == []
    short = memory_budget(recipe, device_bytes=last.device_total - 1).problems
    assert len(short) == 1 and "stage(s) 1 exceed" in short[0] and "weight_sync.bucket_mb" in short[0]
    host = memory_budget(recipe, host_bytes=5759).problems
    assert len(host) == 1 and "node(s) 0, 1" in host[0] and "actor.optimizer_offload_fraction" in host[0]


def test_amd_recipe_fits_its_mi308x_and_without_offload_is_flagged_naming_the_field():
    amd = load_recipe("amd-dsv4-flash-mi308x")
    budget = memory_budget(amd)
    assert budget.device_capacity == 192 * 10**9 and budget.host_capacity is None
    assert budget.problems == []
    assert [s.layers for s in budget.stages] == [11, 11, 11, 10]
    assert 18.2e9 < budget.stages[0].parameters < 18.3e9  # the embedding's stage: 284B / 16 = 17.75B on average
    assert all(s.device_total < 192e9 for s in budget.stages)
    # the case: fp32 masters and moments on the device, 12 bytes x ~18 B parameters per rank
    on_device = load_recipe("amd-dsv4-flash-mi308x",
                            ["actor.optimizer_cpu_offload=false", "actor.optimizer_moment_dtype=fp32"])
    flagged = memory_budget(on_device)
    assert flagged.stages[0].device["optimizer state"] == 12 * flagged.stages[0].parameters  # DP 1: owns all it holds
    assert 210e9 < flagged.stages[0].device["optimizer state"] < 220e9
    assert len(flagged.problems) == 1 and "actor.optimizer_cpu_offload: true" in flagged.problems[0]
    assert "stage(s) 0, 1, 2, 3 exceed 192.0 GB (cluster.device_memory_gb)" in flagged.problems[0]


def test_who_steps_the_optimizer_decides_its_bytes():
    amd = load_recipe("amd-dsv4-flash-mi308x")
    def per_param(recipe):
        o = optimizer_bytes(recipe)
        return o.master, o.moments, o.offloaded_moments, o.host_gradient

    assert per_param(amd) == (4, 4, 8, 4)  # megatron-core 0.16.1: offloaded moments stay fp32
    assert per_param(load_recipe("tiny-cpu")) == (4, 8, 8, 0)  # bf16 weights (AMD's actor), fp32 masters beside
    # fp32 weights are their own masters
    assert per_param(load_recipe("tiny-cpu", ["actor.dtype=fp32"])) == (0, 8, 8, 0)
    with pytest.raises(RecipeError, match="actor.optimizer_moment_dtype: 'bf16' needs the Megatron backend"):
        load_recipe("tiny-cpu", ["actor.optimizer_moment_dtype=bf16"])


def test_pipeline_split_follows_megatrons_uneven_rule():
    assert pipeline_stage_layers(43, 4, 11, 10) == [11, 11, 11, 10]
    assert pipeline_stage_layers(43, 4, None, 10) == [11, 11, 11, 10]
    assert pipeline_stage_layers(8, 4, None, None) == [2, 2, 2, 2]
    assert pipeline_stage_layers(43, 2, 22, 21) == [22, 21]
    for bad in ((43, 4, 11, 9), (43, 4, None, None), (43, 2, 20, 20), (4, 1, 4, None)):
        with pytest.raises(ValueError, match="actor."):
            pipeline_stage_layers(*bad)
    with pytest.raises(RecipeError, match="actor.num_layers_in_first_pipeline_stage=11, actor.num_layers_in_last"):
        load_recipe("amd-dsv4-flash-mi308x", ["actor.num_layers_in_last_pipeline_stage=9"])


@pytest.mark.parametrize("name", ["amd-dsv4-flash-mi308x", "tiny-cpu"])
def test_dry_run_prints_the_budget(name):
    recipe = load_recipe(name)
    plan = plan_placement(recipe)
    text = format_dry_run(recipe, plan, unplaced_rows(plan))
    assert text.endswith(format_budget(recipe, memory_budget(recipe)))
    assert f"memory budget of {name}" in text
    if name == "tiny-cpu":  # CPU mode: everything in host memory, no device rows
        assert "device total" not in text and "host weights" in text
    else:
        assert "of 192.0 GB per device" in text and "host RAM unknown: set cluster.host_memory_gb" in text


def test_repro_check_judges_the_same_numbers():
    amd = load_recipe("amd-dsv4-flash-mi308x")
    busiest = memory_budget(amd).busiest.device_total
    result = C.check_device_memory(amd, amd_cluster_facts())
    assert result.status == C.PASS and f"~{busiest / 1e9:,.1f} GB of 192.0 GB" in result.detail
    assert C.check_device_memory(amd, amd_cluster_facts(device_memory_bytes=busiest - 1)).status == C.FAIL
    no_offload = load_recipe("amd-dsv4-flash-mi308x", ["actor.optimizer_cpu_offload=false"])
    failed = C.check_device_memory(no_offload, amd_cluster_facts())
    assert failed.status == C.FAIL and "actor.optimizer_cpu_offload: true" in failed.fix
    assert C.check_device_memory(amd, amd_cluster_facts(device_memory_bytes=None)).status == C.WARN
    assert C.check_device_memory(load_recipe("tiny-cpu"), laptop_facts()).status == C.SKIP
