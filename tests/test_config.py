"""The recipe schema: committed recipes load, defaults are AMD's run, and each bad input names its field."""

import pytest
import yaml
from pydantic import BaseModel

from repro.recipes.schema import Recipe
from repro.errors import RecipeError
from repro.recipes import (RECIPE_DIR, dump_recipe, list_recipes, load_recipe, recipe_file, require_paths,
                           validate_recipe)


def test_every_committed_recipe_loads():
    names = list_recipes()
    assert names == ["amd-dsv4-flash-mi308x", "h100-8x8-dsv4-flash-verl", "moonlight-16b-1x8-verl", "tiny-cpu",
                     "tiny-cpu-long"]
    for name in names:
        assert load_recipe(name).name == name


def test_amd_recipe_states_the_published_run():
    r = load_recipe("amd-dsv4-flash-mi308x")
    assert (r.cluster.num_nodes, r.cluster.gpus_per_node) == (3, 8)
    assert (r.actor.num_workers, r.actor.tensor_parallel, r.actor.pipeline_parallel) == (16, 4, 4)
    assert (r.actor.expert_parallel, r.actor.expert_tensor_parallel, r.data_parallel) == (4, 1, 1)
    assert r.actor.dtype == "bf16" and r.actor.optimizer_cpu_offload
    assert (r.rollout.tensor_parallel, r.rollout.weight_format, r.rollout.fp8_block) == (8, "fp8_block", [128, 128])
    assert r.rollout.gpu_memory_utilization == 0.92  # LumenRL's file, which ran (the post says 0.90)
    assert r.trajectories_per_step == 256
    assert (r.lengths.max_context, r.lengths.max_response) == (16384, 4096)
    assert (r.rollout_correction.mode, r.rollout_correction.threshold) == ("token", 2.0)
    assert r.routing_replay.enabled and r.checkpoint.every_steps == 25 and r.steps == 75
    assert (r.optim.lr, r.optim.betas, r.optim.weight_decay, r.optim.grad_clip) == (1e-6, [0.9, 0.98], 0.1, 1.0)
    assert (r.algorithm.clip_ratio_low, r.algorithm.clip_ratio_high) == (0.2, 0.28)
    assert r.algorithm.loss_agg_mode == "seq-mean-token-mean" and r.algorithm.kl_coef == 0.0
    assert (r.rollout.temperature, r.eval.samples_per_problem, r.eval.temperature, r.eval.top_p) == (0.8, 8, 0.8, 0.7)
    assert r.model.name == "RedHatAI/DeepSeek-V4-Flash-BF16" and r.seed == 10086
    assert (r.weight_sync.transport, r.weight_sync.bucket_mb, r.weight_sync.quantize_on) == ("rdma", 2048, "rollout")
    assert r.data.train.kind == "dapo_math" and r.data.eval.kind == "aime_2024"
    # conventions of LumenRL's code at 2232f55 that the post does not state (docs/fidelity.md)
    assert (r.rollout.logprobs_mode, r.algorithm.clip_ratio_c, r.algorithm.adv_std) == ("raw", None, "population")
    assert r.reward.boxed_fallback and not r.data.train.dedupe and r.rollout.disable_custom_all_reduce
    assert (r.eval.every_steps, r.eval.at_start, r.eval.after_first_update) == (5, False, True)
    assert not r.rollout_correction.verl_metrics


def test_schema_defaults_equal_the_amd_recipe():
    """A recipe states only its departures, so the schema's defaults must be the published run."""
    amd = load_recipe("amd-dsv4-flash-mi308x").model_dump()
    defaults = Recipe(name="amd-dsv4-flash-mi308x", description=amd["description"]).model_dump()
    assert defaults == amd


def test_long_recipe_is_tiny_cpu_on_the_long_task():
    """tiny-cpu-long departs from tiny-cpu only in what the long task needs (data, lengths, model, batch)."""
    short, long = load_recipe("tiny-cpu").model_dump(), load_recipe("tiny-cpu-long").model_dump()

    def leaves(tree, prefix=""):
        for key, value in tree.items():
            yield from leaves(value, f"{prefix}{key}.") if isinstance(value, dict) else [(prefix + key, value)]

    flat_short = dict(leaves(short))
    changed = sorted(key for key, value in leaves(long) if flat_short[key] != value)
    assert changed == ["algorithm.prompts_per_step", "data.eval.kind", "data.train.kind", "description",
                       "lengths.max_context", "lengths.max_response", "model.name", "model.path", "name"]
    r = load_recipe("tiny-cpu-long")
    assert r.lengths.max_response >= 12 * 13 + 11 + 1  # the longest worked answer at terms 12, + EOS


def test_tiny_recipe_keeps_the_structure():
    t = load_recipe("tiny-cpu")
    assert t.trajectories_per_step == 256 and t.steps == 75 and t.checkpoint.every_steps == 25
    assert t.rollout_correction.threshold == 2.0 and t.routing_replay.enabled
    assert t.rollout.weight_format == "fp8_block" and t.cluster.gpus_per_node == 0


@pytest.mark.parametrize("base, tiny_name", [("amd-dsv4-flash-mi308x", "tiny-cpu"),
                                             ("amd-dsv4-flash-mi308x", "tiny-cpu-long"), ("tiny-cpu", "tiny-cpu-long")])
def test_every_tiny_departure_carries_a_comment(base, tiny_name):
    """Each tiny value that differs from its base's sits on a line with a `#` comment (or under a commented key)."""
    amd = load_recipe(base).model_dump()
    tiny = load_recipe(tiny_name).model_dump()
    lines = (RECIPE_DIR / f"{tiny_name}.yaml").read_text().splitlines()

    def differing(a, b, prefix=""):
        for key, value in b.items():
            if isinstance(value, dict):
                yield from differing(a[key], value, f"{prefix}{key}.")
            elif value != a[key] and key not in ("name", "description"):
                yield prefix + key

    uncommented = []
    for field in differing(amd, tiny):
        leaf = field.split(".")[-1]
        hits = [i for i, line in enumerate(lines) if line.strip().startswith(f"{leaf}:")]
        if not any("#" in lines[i] or "#" in lines[i - 1] for i in hits):
            uncommented.append(field)
    assert uncommented == []


def _all_fields(model: type[BaseModel], prefix=""):
    for name, info in model.model_fields.items():
        yield prefix + name, info
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _all_fields(annotation, f"{prefix}{name}.")


def test_every_field_has_a_help_line():
    fields = list(_all_fields(Recipe))
    assert len(fields) > 80
    assert [f for f, info in fields if not (info.description or "").strip()] == []


def _bad(overrides, base="amd-dsv4-flash-mi308x"):
    with pytest.raises(RecipeError) as err:
        load_recipe(base, overrides)
    return str(err.value)


AMD_FILE = recipe_file("amd-dsv4-flash-mi308x")


@pytest.mark.parametrize(
    "override, expected",
    [
        ("bogus=1", "bogus: unknown key"),
        ("actor.tensor_paralel=4", "actor.tensor_paralel: unknown key"),
        ("actor.tensor_parallel='4'", "actor.tensor_parallel: Input should be a valid integer (got str '4')"),
        ("optim.lr=abc", "optim.lr: Input should be a valid number (got str 'abc')"),
        ("routing_replay.enabled=yes please", "routing_replay.enabled: Input should be a valid boolean"),
        ("rollout.fp8_format=e5m2", "rollout.fp8_format: Input should be 'auto', 'e4m3fn' or 'e4m3fnuz'"),
        ("actor.tensor_parallel=3",
         "actor.num_workers: 16 workers is not TP x PP x DP for TP=3, PP=4 (needs a multiple of 12)"),
        ("actor.expert_parallel=3", "actor.expert_parallel: EP=3 does not divide model.num_routed_experts=256"),
        ("actor.expert_parallel=32",
         "actor.expert_parallel: EP=32 x ETP=1 x PP=4 = 128 does not divide actor.num_workers=16"),
        ("rollout.tensor_parallel=16", "rollout.tensor_parallel: TP=16 spans more than one node"),
        ("actor.num_workers=24",
         "actor.num_workers: 24 one-GPU workers do not fit on actor.nodes=2 x cluster.gpus_per_node=8"),
        ("lengths.max_response=16384", "lengths.max_response: 16384 leaves no room for a prompt"),
        ("algorithm.responses_per_prompt=1",
         "algorithm.responses_per_prompt: Input should be greater than or equal to 2"),
        ("optim.betas=[0.9]", "optim.betas: List should have at least 2 items"),
        ("optim.betas=[0.9, 1.5]", "optim.betas: each beta must be in [0, 1)"),
        ("data.train.path=null", "data.train: path: required for kind 'dapo_math'"),
        ("rollout_correction.threshold=0.5",
         "rollout_correction.threshold: Input should be greater than or equal to 1"),
    ],
)
def test_bad_recipe_names_the_field(override, expected):
    message = _bad([override])
    # the override is named as the source; alone when every problem is in the field it set
    head = message.splitlines()[0]
    assert head in (f"override {override!r} (on {AMD_FILE}): invalid recipe",
                    f"{AMD_FILE} with override {override!r}: invalid recipe")
    fields = {line.strip().split(":")[0] for line in message.splitlines()[1:]}
    assert head.startswith("override") == (fields == {override.split("=", 1)[0]})
    assert expected in message


def test_override_values_read_as_a_person_means_them_and_misspelt_keys_get_the_nearest_names():
    recipe = load_recipe("tiny-cpu", ["optim.lr=1e-6", "optim.eps=2E-3"], steps=5)
    assert (recipe.optim.lr, recipe.optim.eps, recipe.steps) == (1e-6, 2e-3, 5)
    with pytest.raises(RecipeError, match=r"optim.lrr: unknown key \(not in the recipe schema\); did you mean lr\?"):
        load_recipe("tiny-cpu", ["optim.lrr=1"])
    with pytest.raises(RecipeError, match=r"^override 'steps=-1' \(on .*tiny-cpu.yaml\): invalid recipe\n  "
                                          r"steps: Input should be greater than or equal to 1"):
        load_recipe("tiny-cpu", steps=-1)  # a notebook's `-p steps -1`


def test_a_recipe_file_reads_1e_minus_6_as_a_number(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("name: r\noptim:\n  lr: 1e-6\n")
    assert load_recipe(path).optim.lr == 1e-6


def test_missing_recipe_and_bad_yaml(tmp_path):
    with pytest.raises(RecipeError, match="unknown recipe 'nope'; committed recipes: amd-dsv4-flash-mi308x, "
                       "h100-8x8-dsv4-flash-verl, moonlight-16b-1x8-verl, tiny-cpu"):
        load_recipe("nope")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(RecipeError, match="broken.yaml: not valid YAML"):
        load_recipe(broken)
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n")
    with pytest.raises(RecipeError, match="list.yaml: a recipe is a mapping of sections, got list"):
        load_recipe(listy)
    with pytest.raises(RecipeError, match="override 'steps': expected dotted.field=value"):
        load_recipe("tiny-cpu", ["steps"])


def test_required_paths_are_named(tmp_path):
    recipe = load_recipe("amd-dsv4-flash-mi308x", [f"data.eval.path={tmp_path}"])
    with pytest.raises(RecipeError) as err:
        require_paths(recipe, ("model.path", "data.train.path", "data.eval.path"))
    message = str(err.value)
    assert "model.path: path does not exist: /dev/shm/models/DeepSeek-V4-Flash-BF16" in message
    assert "data.train.path: path does not exist: /dev/shm/datasets/dapo-math-17k/dapo-math-17k.parquet" in message
    assert "data.eval.path" not in message


def test_resolved_recipe_round_trips(tmp_path):
    recipe = load_recipe("tiny-cpu", ["steps=3", "optim.lr=2.0e-4"])
    path = dump_recipe(recipe, tmp_path / "recipe.yaml")
    assert validate_recipe(yaml.safe_load(path.read_text())) == recipe
    assert (recipe.steps, recipe.optim.lr) == (3, 2e-4)
    assert not (tmp_path / "recipe.yaml.tmp").exists()
