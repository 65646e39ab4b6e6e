"""Our overrides composed by verl 0.9.1's own Hydra config and checked by its own validate_config, on the AMD recipe
(--set engine=verl), the NVIDIA recipe and the one-node rehearsal; verl's published DSV4-Flash script beside them (it
does not compose on 0.9.1 until the key 0.9.1 dropped is left out); each value verl only refuses at run time, shown to
pass compose and validation and then refused by our checks, naming the key; verl's own math_dapo beside our reward."""

from pathlib import Path

import pytest

from repro.recipes import load_recipe
from repro.verl import compose, published
from repro.verl.run import environment, run_files
from repro.verl import overrides as ov

RECIPES = [("amd-dsv4-flash-mi308x", ["engine=verl"]), ("h100-8x8-dsv4-flash-verl", []),
           ("moonlight-16b-1x8-verl", [])]


def written(name, sets, tmp_path):
    recipe = load_recipe(name, list(sets))
    files = run_files(recipe, tmp_path, None, 1)
    return ov.verl_overrides(recipe, files, environment(recipe, files))


@pytest.mark.parametrize("name, sets", RECIPES)
def test_our_configs_compose_validate_and_pass_the_run_time_checks(name, sets, tmp_path):
    config = compose.check_config(written(name, sets, tmp_path))
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    assert actor.strategy == "megatron" and actor.megatron.router_replay.mode == "R3"
    assert rollout.logprobs_mode == "raw_logprobs" and rollout.quantization == "fp8"
    assert config.algorithm.rollout_correction.rollout_is == "token" and actor.clip_ratio_c == 1e9
    assert actor.optim.override_optimizer_config.adam_beta2 == 0.98
    assert config.trainer.resume_mode == "disable" and list(config.trainer.logger) == ["console", "file"]
    assert config.reward.custom_reward_function.reward_kwargs.boxed_fallback is True
    assert compose.megatron_optimizer_fields() is not None  # the override keys were checked against megatron's


def test_verls_published_script_does_not_compose_on_0_9_1_until_grad_offload_is_left_out():
    with pytest.raises(compose.VerlConfigError, match="grad_offload"):
        compose.compose_config(published.published_overrides())
    config = compose.compose_config(published.published_overrides(compose_on_0_9_1=True))
    assert config.actor_rollout_ref.actor.megatron.pipeline_model_parallel_size == 8


def test_the_h100_recipe_differs_from_the_published_script_only_where_its_header_says(tmp_path):
    ours = compose.flat(compose.check_config(written("h100-8x8-dsv4-flash-verl", [], tmp_path)))
    theirs = compose.flat(compose.compose_config(published.published_overrides(compose_on_0_9_1=True)))
    same = ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size",
            "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size",
            "actor_rollout_ref.actor.megatron.expert_model_parallel_size",
            "actor_rollout_ref.actor.megatron.param_offload",
            "actor_rollout_ref.rollout.data_parallel_size", "actor_rollout_ref.rollout.expert_parallel_size",
            "actor_rollout_ref.rollout.gpu_memory_utilization", "trainer.nnodes", "trainer.n_gpus_per_node",
            "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes",
            "actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_offload_fraction"]
    assert {k: (ours[k], theirs[k]) for k in same if ours[k] != theirs[k]} == {}
    differ = {"data.train_batch_size": (32, 8), "data.max_response_length": (4096, 10240),
              "actor_rollout_ref.rollout.quantization": ("fp8", None), "trainer.total_training_steps": (75, 400)}
    assert {k: (ours[k], theirs[k]) for k in differ} == differ


BAD = [("algorithm.rollout_correction.rollout_is=tokn", "algorithm.rollout_correction"),
       ("algorithm.adv_estimator=grpoo", "algorithm.adv_estimator"),
       ("actor_rollout_ref.rollout.logprobs_mode=raw", "actor_rollout_ref.rollout.logprobs_mode"),
       ("actor_rollout_ref.actor.optim.lr=abc", "actor_rollout_ref.actor.optim"),
       ("actor_rollout_ref.actor.clip_ratio_c=1.0", "actor_rollout_ref.actor.clip_ratio_c"),
       ("trainer.logger=[console,fiel]", "trainer.logger"),
       ("+actor_rollout_ref.actor.optim.override_optimizer_config.adam_betaa=0.9",
        "actor_rollout_ref.actor.optim.override_optimizer_config")]


@pytest.mark.parametrize("bad, key", BAD)
def test_each_value_verl_only_refuses_at_run_time_is_refused_before_launch(bad, key, tmp_path):
    overrides = written("amd-dsv4-flash-mi308x", ["engine=verl"], tmp_path) + [bad]
    config = compose.compose_config(overrides)  # verl's compose and validate_config let it through
    problems = compose.runtime_problems(config)
    assert len(problems) == 1 and problems[0].startswith(key + ":")
    with pytest.raises(compose.VerlConfigError, match=key.replace(".", "[.]")):
        compose.check_config(overrides)


def test_verls_math_dapo_fallback_differs_from_lumenrls_which_our_reward_follows():
    from verl.utils.reward_score import math_dapo

    from repro.verl.reward_fn import compute_score

    response = "The sum is \\boxed{ 12 }"
    assert math_dapo.compute_score(response, "12")["score"] == -1.0  # verl's own rule
    assert compute_score("math_dapo", response, "12")["score"] == 1.0  # LumenRL's, AMD's run
    for text, truth in (("Answer: 7", "7"), ("Answer: 3/4", "\\frac{3}{4}"), ("no answer", "5")):
        assert math_dapo.compute_score(text, truth)["score"] == compute_score("math_dapo", text, truth)["score"]


def test_the_written_config_file_is_the_composed_one(tmp_path):
    from omegaconf import OmegaConf

    config = compose.check_config(written("moonlight-16b-1x8-verl", [], tmp_path))
    path = compose.write_composed(config, tmp_path / "verl" / "config.yaml", "header line")
    assert path.read_text().startswith("# header line\n")
    again = OmegaConf.load(path)
    assert again.actor_rollout_ref.actor.megatron.expert_model_parallel_size == 8
    assert not list(Path(tmp_path / "verl").glob(".*.tmp"))


def test_the_dry_run_says_verl_composed_and_validated_the_config(capsys, tmp_path):
    import argparse

    from repro.commands import launch

    parser = argparse.ArgumentParser()
    launch.add_arguments(parser)
    assert launch.run(parser.parse_args(["--recipe", "h100-8x8-dsv4-flash-verl", "--dry-run", "--run-dir",
                                         str(tmp_path)])) == 0
    out = capsys.readouterr().out
    assert "composed by verl's Hydra config and validated by verl's validate_config and the run-time checks here" in out
    assert "REFUSES" not in out and "missing here" not in out
