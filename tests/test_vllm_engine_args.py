"""engine_args_from_recipe: the recipe -> vLLM arguments mapping, pure (runs without vLLM installed)."""

import json

import pytest

from repro.errors import ReproError
from repro.recipes import load_recipe
from repro.rollout.vllm_args import CLUSTER_PINS, WORKER_EXTENSION, VLLMConfigError, engine_args_from_recipe


def test_cluster_recipe_serves_block_fp8_with_tp8():
    recipe = load_recipe("amd-dsv4-flash-mi308x")
    args = engine_args_from_recipe(recipe, "/models/dsv4")
    assert args == {
        "model": "/models/dsv4", "tokenizer": "/models/dsv4", "dtype": "bfloat16", "seed": 10086,
        "max_model_len": 16384, "max_num_seqs": 48, "max_num_batched_tokens": 8192, "enforce_eager": True,
        "disable_custom_all_reduce": True,
        "logprobs_mode": "raw_logprobs", "max_logprobs": 0, "enable_prefix_caching": False,
        "enable_return_routed_experts": True,
        "worker_extension_cls": WORKER_EXTENSION, "tensor_parallel_size": 8, "quantization": "fp8_per_block",
        "kv_cache_dtype": "fp8_e4m3", "gpu_memory_utilization": 0.92,
        # vLLM's own worker processes inside the rollout actor: left to vLLM, its Ray executor would take the actor's
        # {GPU: 8} bundle and refuse it (test_cluster_placement.py shows what the actor sees)
        "distributed_executor_backend": "mp",
    }
    assert CLUSTER_PINS["vllm"] == "0.25.1" and CLUSTER_PINS["rocm"] == "7.2"
    # AMD's run took vLLM's default raw_logprobs (LumenRL sets none); the sampled distribution is one --set away
    processed = load_recipe("amd-dsv4-flash-mi308x", ["rollout.logprobs_mode=processed"])
    assert engine_args_from_recipe(processed, "/models/dsv4")["logprobs_mode"] == "processed_logprobs"


def test_bf16_rollout_and_no_routing_replay():
    recipe = load_recipe("amd-dsv4-flash-mi308x", ["rollout.weight_format=bf16", "routing_replay.enabled=false"])
    args = engine_args_from_recipe(recipe, "/m")
    assert args["quantization"] is None and args["enable_return_routed_experts"] is False
    # prefix caching is off only while routing is replayed (LumenRL's DeepSeek-V4 run: R3 on, caching off)
    assert args["enable_prefix_caching"] is True


def test_fp4_experts_are_refused_on_gfx942_only(tmp_path):
    """The official release's MXFP4 experts: no FP4 kernels on MI308X; FP8 experts or another GPU are fine."""
    from repro.fp8.official import OFFICIAL_CONFIG_KEYS
    from repro.rollout.vllm_args import check_servable

    config = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", **OFFICIAL_CONFIG_KEYS}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(VLLMConfigError,
                       match=r"expert_dtype fp4\) holds MXFP4.*gfx950.*RedHatAI/DeepSeek-V4-Flash-BF16"):
        check_servable(tmp_path, "gfx942:sramecc+:xnack-")
    check_servable(tmp_path, "gfx950")
    check_servable(tmp_path, None)  # CPU / CUDA
    (tmp_path / "config.json").write_text(json.dumps({**config, "expert_dtype": "fp8"}))
    check_servable(tmp_path, "gfx942")
    del config["expert_dtype"]  # vLLM reads a missing expert_dtype as fp4
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(VLLMConfigError, match="absent, which vLLM reads as fp4"):
        check_servable(tmp_path, "gfx942")


def test_cpu_recipe_is_bf16_tp1_without_chunked_prefill():
    recipe = load_recipe("tiny-cpu", ["rollout.backend=vllm"])
    args = engine_args_from_recipe(recipe.model_dump(), "/m")  # a resolved-recipe dict works too
    assert args["quantization"] is None and args["kv_cache_dtype"] == "auto" and args["tensor_parallel_size"] == 1
    assert args["enable_chunked_prefill"] is False and args["max_num_batched_tokens"] >= args["max_model_len"] == 64
    assert args["max_num_seqs"] == 256 and "gpu_memory_utilization" not in args
    assert args["enable_prefix_caching"] is False and "enable_return_routed_experts" not in args  # hook capture
    assert args["logprobs_mode"] == "raw_logprobs" and args["seed"] == recipe.seed  # tiny-cpu follows AMD


@pytest.mark.parametrize("override, field", [
    ("rollout.fp8_block=[64, 64]", "rollout.fp8_block"),
    ("rollout.fp8_scale=ue8m0", "rollout.fp8_scale"),
])
def test_settings_vllm_cannot_serve_are_named(override, field):
    recipe = load_recipe("amd-dsv4-flash-mi308x", [override])
    with pytest.raises(VLLMConfigError, match=field) as info:
        engine_args_from_recipe(recipe, "/m")
    assert isinstance(info.value, ReproError)


def test_cpu_lane_refuses_tensor_parallel():
    recipe = load_recipe("tiny-cpu", ["rollout.backend=vllm", "rollout.tensor_parallel=2"])
    with pytest.raises(VLLMConfigError, match="rollout.tensor_parallel=2"):
        engine_args_from_recipe(recipe, "/m")


@pytest.mark.parametrize("override, says", [
    ("rollout.activation_quant=none", "always quantises activations per token in groups of 128"),
    ("rollout.activation_group=64", "activation_group=64"),
    ("rollout.activation_dtype=fp32", "serves in bfloat16"),
])
def test_rollout_numerics_vllm_cannot_switch_are_refused(override, says):
    with pytest.raises(VLLMConfigError, match=says):
        engine_args_from_recipe(load_recipe("amd-dsv4-flash-mi308x", [override]), "/m")
