"""The recipe as LumenRL's config: every key the recipe determines equals LumenRL's published longrun / smoke file, key
path by key path (the facts are in tests/lumenrl_support.py), except where AMD's post and the file differ and the
post wins; what a recipe must satisfy to run on LumenRL; the written file."""

import math

import pytest
import yaml

from lumenrl_support import LONGRUN_2232F554, LUMENRL_DEFAULTS, SMOKE_B039BA2, nested
from repro.errors import RecipeError
from repro.lumenrl.config import (REMOVED, changed_keys, config_notes, flatten, lumenrl_config, recipe_settings,
                                  run_settings, write_config)
from repro.recipes import load_recipe

AMD = "amd-dsv4-flash-mi308x"
ON_LUMENRL = ["engine=lumenrl", "lumenrl.path=/workspace/Lumen-RL"]
ABSENT = object()

# AMD's post against LumenRL's longrun file: the post wins (the recipe states the post)
POST_WINS = {
    "policy.generation.vllm_cfg.gpu_memory_utilization": (0.90, 0.92),
    "num_training_steps": (75, 200),   # the long-run file's run went to 200; the post reports 75 steps
    "val_steps": (25, 5),              # the post evaluates at 0, 25, 50, 75; the file every 5 updates
}
# where the data was staged is the site's: the recipe names verl's parquet, LumenRL's file a JSONL copy of the rows
SITE_PATHS = {
    "reward.dataset": ("/dev/shm/datasets/dapo-math-17k/dapo-math-17k.parquet",
                       "/dev/shm/datasets/dapo-math-17k/dapo-math-17k.jsonl"),
    "val_dataset": ("/dev/shm/datasets/aime-2024/aime-2024.parquet", "/dev/shm/datasets/aime-2024/aime-2024.jsonl"),
}


def differences(settings: dict, published: dict) -> dict:
    out = {}
    for key, value in settings.items():
        fact = published.get(key, LUMENRL_DEFAULTS.get(key, ABSENT))
        assert fact is not ABSENT, f"{key}: written, but neither the published file nor LumenRL's schema has it"
        if fact != value or type(fact) is not type(value):
            out[key] = (value, fact)
    return out


def test_amd_recipe_writes_the_published_longrun_values_key_by_key():
    settings = recipe_settings(load_recipe(AMD, ON_LUMENRL))
    assert len(settings) == 77  # + uneven pipeline stages and the offload fraction (issue 16)
    assert differences(settings, LONGRUN_2232F554) == {**POST_WINS, **SITE_PATHS}


def test_post_wins_values_are_the_recipes():
    recipe = load_recipe(AMD)
    assert (recipe.rollout.gpu_memory_utilization, recipe.steps, recipe.eval.every_steps) == (0.90, 75, 25)


def test_a_recipe_stating_the_smoke_run_writes_the_published_smoke_values():
    smoke = load_recipe(AMD, ON_LUMENRL + [
        "steps=3", "algorithm.prompts_per_step=1", "lengths.max_context=512", "lengths.max_response=256",
        "actor.max_tokens_per_micro_batch=512", "actor.dtype=fp32", "rollout.max_num_seqs=32",
        "rollout.gpu_memory_utilization=0.92", "weight_sync.timeout_s=1200", "rollout_correction.mode=none",
        "eval.every_steps=9999", "checkpoint.every_steps=9999", "checkpoint.keep_last=1",
        "model.path=/root/models/DeepSeek-V4-Flash-BF16",
        "data.train.path=/dev/shm/datasets/dapo-math-17k/dapo-math-17k.jsonl",
        "data.eval.path=/dev/shm/datasets/aime-2024/aime-2024.jsonl"])
    settings = recipe_settings(smoke)
    assert "eval.num_generations" not in settings  # validation off: its knobs are not written
    # what no recipe can say: the schema's optimizer is Adam; the smoke file serves FP8 vLLM weights
    # (vllm_cfg.quantization fp8_per_block) yet states rollout precision bf16
    assert differences(settings, SMOKE_B039BA2) == {"policy.optimizer_type": ("adam", "sgd"),
                                                    "quantization.rollout.precision": ("fp8", "bf16")}


def test_written_config_is_the_base_with_the_recipes_and_the_runs_keys(tmp_path):
    recipe = load_recipe(AMD, ON_LUMENRL + ["lumenrl.actor_node_ips=10.0.0.2,10.0.0.3"])
    base = nested(LONGRUN_2232F554)
    written = lumenrl_config(recipe, base, tmp_path / "ck", resume=True)
    assert base == nested(LONGRUN_2232F554)  # the published config is not modified
    flat = flatten(written)
    for key, value in recipe_settings(recipe).items():
        assert flat[key] == value
    # everything the recipe does not decide is the base file's
    untouched = set(LONGRUN_2232F554) - set(recipe_settings(recipe)) - set(run_settings(recipe, "x", True))
    untouched -= {"controller.ray.actor.topology_tags.node_ips", "controller.ray.rollout.topology_tags.node_ips"}
    assert untouched and all(flat[k] == LONGRUN_2232F554[k] for k in untouched)
    assert flat["weight_sync.rdma.interface"] == "ens50f0" and flat["policy.gen_batch_size"] == 32
    assert flat["checkpointing.checkpoint_dir"] == str(tmp_path / "ck") and flat["checkpointing.resume"] is True
    assert flat["controller.ray.actor.topology_tags.node_ips"] == "10.0.0.2,10.0.0.3"
    assert flat["controller.ray.rollout.topology_tags"] == {}  # AMD's rollout IP is not pinned elsewhere
    assert (flat["logger.wandb_enabled"], flat["logger.log_interval"]) == (False, 1)
    changed = {k: (old, new) for k, old, new in changed_keys(base, written)}
    assert changed["controller.ray.rollout.topology_tags.node_ips"] == ("10.235.200.32", REMOVED)
    assert changed["num_training_steps"] == (200, 75) and "cluster.num_nodes" not in changed


def test_write_config_is_yaml_under_a_comment_header(tmp_path):
    config = lumenrl_config(load_recipe(AMD, ON_LUMENRL), nested(LONGRUN_2232F554), "/ck", resume=False)
    path = write_config(config, tmp_path / "lumenrl" / "config.yaml", "line one\n\nline three")
    text = path.read_text()
    assert text.startswith("# line one\n#\n# line three\n") and yaml.safe_load(text) == config
    assert [p.name for p in path.parent.iterdir()] == ["config.yaml"]


def test_other_recipe_values_map_to_lumenrls_words():
    recipe = load_recipe(AMD, ON_LUMENRL + ["rollout.weight_format=bf16", "actor.recompute=none", "steps=20",
                                            "eval.every_steps=30", "weight_sync.quantize_on=trainer",
                                            "weight_sync.timeout_s=90.5", "rollout_correction.mode=sequence",
                                            "actor.num_workers=12", "actor.tensor_parallel=2", "actor.expert_parallel=2",
                                            "actor.pipeline_parallel=2", "actor.num_layers_in_first_pipeline_stage=22",
                                            "actor.num_layers_in_last_pipeline_stage=21"])
    s = recipe_settings(recipe)
    assert (s["policy.training.megatron_cfg.num_layers_in_first_pipeline_stage"],
            s["policy.training.megatron_cfg.num_layers_in_last_pipeline_stage"]) == (22, 21)
    assert s["policy.generation.vllm_cfg.quantization"] == "" and s["quantization.rollout.precision"] == "bf16"
    assert s["weight_sync.fp8_quantization_location"] is None  # LumenRL accepts a location only for fp8_per_block
    assert s["policy.training.megatron_cfg.recompute_granularity"] is None
    assert (s["val_steps"], s["eval.enabled"]) == (0, False) and "eval.top_p" not in s
    assert s["weight_sync.timeout_s"] == 91 and isinstance(s["weight_sync.timeout_s"], int)
    assert s["quantization.rollout_correction.rollout_is"] == "sequence"
    assert s["controller.ray.actor.process_on_nodes"] == [6, 6]
    fp8_on_trainer = load_recipe(AMD, ON_LUMENRL + ["weight_sync.quantize_on=trainer"])
    assert recipe_settings(fp8_on_trainer)["weight_sync.fp8_quantization_location"] == "trainer"


def test_notes_say_where_lumenrl_will_not_do_what_the_recipe_says():
    notes = config_notes(load_recipe(AMD, ON_LUMENRL + ["steps=30"]))
    assert len(notes) == 3 and "no step-0 evaluation" in notes[0] and "step 30 itself is not checkpointed" in notes[2]
    assert notes[1].startswith("lumenrl.actor_node_ips / rollout_node_ips: unset")
    pinned = ["lumenrl.actor_node_ips=10.0.0.2,10.0.0.3", "lumenrl.rollout_node_ips=10.0.0.1", "eval.at_start=false"]
    assert config_notes(load_recipe(AMD, ON_LUMENRL + pinned)) == []
    assert "validation is off" in config_notes(load_recipe(AMD, ON_LUMENRL + ["steps=10"]))[0]


@pytest.mark.parametrize("overrides, expected", [
    (["engine=lumenrl"], "lumenrl.path: required when engine is lumenrl"),
    (ON_LUMENRL + ["algorithm.updates_per_step=2"], "algorithm.updates_per_step: LumenRL takes"),
    (ON_LUMENRL + ["algorithm.norm_adv_by_std=false"], "algorithm.norm_adv_by_std: LumenRL's grpo estimator always"),
    (ON_LUMENRL + ["algorithm.entropy_coef=0.01"], "algorithm.entropy_coef: LumenRL's GRPO config has no entropy"),
    (ON_LUMENRL + ["rollout_correction.mode=token_mask"], "rollout_correction.mode: 'token_mask' is not mapped"),
    (ON_LUMENRL + ["reward.verifier=math_verify"], "reward.verifier: LumenRL scores with"),
    (ON_LUMENRL + ["weight_sync.transport=ray_object_store"], "weight_sync.transport: LumenRL syncs"),
    (ON_LUMENRL + ["model.path=builtin:tiny-dsv4-warm"], "model.path: LumenRL loads a checkpoint folder"),
])
def test_what_lumenrl_cannot_run_is_refused_naming_the_field(overrides, expected):
    with pytest.raises(RecipeError) as err:
        load_recipe(AMD, overrides)
    assert expected in str(err.value)


def test_the_tiny_recipe_on_lumenrl_names_every_field_at_fault():
    with pytest.raises(RecipeError) as err:
        load_recipe("tiny-cpu", ON_LUMENRL)
    fields = [line.strip().split(":")[0] for line in str(err.value).splitlines()[1:]]
    assert fields == ["actor.backend", "rollout.backend", "weight_sync.transport", "data.train.kind", "data.eval.kind",
                      "model.path"]


def test_the_repro_engine_ignores_the_lumenrl_section():
    recipe = load_recipe("tiny-cpu", ["lumenrl.ray_stop_first=true"])
    assert recipe.engine == "repro" and recipe.lumenrl.ray_stop_first and not math.isnan(recipe.optim.lr)


def test_the_walkthroughs_cluster_recipe_is_a_valid_lumenrl_recipe(tmp_path):
    """docs/cluster-walkthrough.md shows a site recipe; it must load as written and pin what it says."""
    import re

    import repro

    text = (repro.REPO_DIR / "docs" / "cluster-walkthrough.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "my-cluster.yaml" in b]
    path = tmp_path / "my-cluster.yaml"
    path.write_text(block)
    recipe = load_recipe(path)
    settings = {**recipe_settings(recipe), **run_settings(recipe, recipe.lumenrl.checkpoint_dir, resume=False)}
    assert recipe.engine == "lumenrl" and recipe.steps == 75
    assert settings["controller.ray.rollout.topology_tags"] == {"node_ips": "10.0.0.1"}
    assert settings["reward.dataset"] == "/dev/shm/datasets/dapo-math-17k/dapo-math-17k.jsonl"
    assert recipe.lumenrl.env["NCCL_SOCKET_IFNAME"] == "ens14np0" and len(recipe.lumenrl.overrides) == 3
