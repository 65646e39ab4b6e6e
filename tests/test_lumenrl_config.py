"""The recipe as LumenRL's config: every key written is one LumenRL's DeepSeek-V4 path reads (the line that reads it,
at 2232f55, is named below), and equals LumenRL's published longrun / smoke file key path by key path (the facts are
in tests/lumenrl_support.py) except where the recipe says otherwise; what a recipe must satisfy to run on LumenRL;
the written file and its notes."""

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
MEG, VLLM = "policy.training.megatron_cfg.", "policy.generation.vllm_cfg."
R, W, E = "trainer/rl_trainer.py", "workers/actor_worker.py", "engine/training/megatron_lumen_dsv4_engine.py"

# Why each key is written: where LumenRL 2232f55 reads it on the DeepSeek-V4 path -- Ray controller
# (RLTrainer._setup_ray_controller / _train_with_ray_controller), the megatron_lumen_dsv4 engine built by
# LumenActorWorker, the ray_http vLLM rollout, RDMA weight sync (paths under lumenrl/)
READ_AT = {
    "cluster.num_nodes": "controller/ray_cluster.py:106 (Ray GPUs without an address), trainer/rl_trainer.py:3866",
    "cluster.gpus_per_node": "controller/ray_cluster.py:106, trainer/rl_trainer.py:3866",
    "cluster.ray_address": "controller/ray_cluster.py:103-104, trainer/rl_trainer.py:127",
    "controller.ray.actor.num_workers": f"{R}:982",
    "controller.ray.actor.process_on_nodes": f"{R}:990",
    "controller.ray.rollout.num_workers": f"{R}:998-1002",
    "controller.ray.rollout.process_on_nodes": f"{R}:1003",
    "weight_sync.backend": f"{R}:749-753 (RDMA sync), 936",
    "weight_sync.bucket_size_mb": f"{R}:816",
    "weight_sync.timeout_s": f"{R}:498, 824",
    "weight_sync.fp8_quantization_location": f"{R}:434 (checked), 806 (resolve_fp8_quantize)",
    "policy.model_name": f"{R}:965, {W}:100",
    "policy.training_backend": f"{W}:85-96, {R}:412",
    "policy.generation_backend": f"{R}:111-112 (_use_vllm)",
    "policy.max_total_sequence_length": f"{R}:1522 (prompt truncation, from _collect_rollout_batch at 2178)",
    "policy.max_response_length": f"{R}:707 (rollout max_tokens), 724 (evaluation)",
    "policy.train_global_batch_size": f"{R}:2156 (prompts per step)",
    "policy.max_token_len_per_gpu": f"{R}:3619, 4051",
    "policy.optimizer_type": f"{W}:328 -> {E}:1006-1008",
    "policy.learning_rate": f"{W}:326 -> {E}:1010, 1042-1046",
    "policy.lr_warmup_steps": f"{W}:332 -> {E}:1041",
    "policy.weight_decay": f"{W}:330 -> {E}:1011",
    "policy.max_grad_norm": f"{W}:331 -> {E}:973, 1016",
    "policy.adam_beta1": f"{W}:335-337 -> {E}:1012",
    "policy.adam_beta2": f"{W}:335-337 -> {E}:1013",
    "policy.adam_eps": f"{W}:335-337 -> {E}:1014",
    MEG + "tensor_model_parallel_size": f"{W}:260 -> {E}:562",
    MEG + "pipeline_model_parallel_size": f"{W}:261 -> {E}:563",
    MEG + "expert_model_parallel_size": f"{W}:263 -> {E}:565",
    MEG + "expert_tensor_parallel_size": f"{W}:267 -> {E}:572",
    MEG + "sequence_parallel": f"{W}:264 -> {E}:748",
    MEG + "recompute_granularity": f"{W}:310 -> {E}:695-696",
    MEG + "optimizer_cpu_offload": f"{W}:287 -> {E}:985, 191 (streamed Adam requires it)",
    MEG + "optimizer_offload_fraction": f"{W}:288 -> {E}:986, 197 (streamed Adam requires 1.0)",
    MEG + "streamed_optimizer_mode": f"{W}:292 -> {E}:125, 186-204",
    MEG + "streamed_optimizer_moment_dtype": f"{W}:300 -> {E}:165, 361-367 (Adam moments' dtype)",
    MEG + "num_layers_in_first_pipeline_stage": f"{W}:320 -> {E}:691",
    MEG + "num_layers_in_last_pipeline_stage": f"{W}:321 -> {E}:692",
    VLLM + "tensor_parallel_size": f"{R}:438",
    VLLM + "quantization": f"{R}:466-467",
    VLLM + "kv_cache_dtype": f"{R}:464-465",
    VLLM + "gpu_memory_utilization": f"{R}:441",
    VLLM + "max_model_len": f"{R}:462-463",
    VLLM + "max_num_seqs": f"{R}:448",
    VLLM + "max_num_batched_tokens": f"{R}:447",
    VLLM + "enforce_eager": f"{R}:443",
    VLLM + "disable_custom_all_reduce": f"{R}:444",
    VLLM + "temperature": f"{R}:711 (sampling), 4045-4047 (the trainer's logits / T)",
    VLLM + "top_p": f"{R}:712",
    VLLM + "top_k": f"{R}:713",
    "algorithm.name": f"{R}:163, 4037",
    "algorithm.adv_estimator": "algorithms/base_algorithm.py:42",
    "algorithm.loss_agg_mode": f"engine/training/megatron_engine.py:1956 (algo_config, {R}:4041)",
    "algorithm.clip_ratio_high": "engine/training/megatron_engine.py:2093",
    "algorithm.grpo.num_generations": f"{R}:48",
    "algorithm.grpo.kl_coeff": f"{R}:977",
    "algorithm.grpo.clip_ratio": "engine/training/megatron_engine.py:2092",
    "quantization.rollout_correction.rollout_is": f"{R}:4069, algorithms/rollout_correction.py:506",
    "quantization.rollout_correction.rollout_is_threshold": "algorithms/rollout_correction.py:507",
    "moe.r3.enabled": f"{R}:457, 598, {W}:279-284",
    "reward.dataset": f"{R}:1210",
    "reward.shuffle_seed": f"{R}:1249",
    "val_dataset": f"{R}:1148",
    "val_steps": f"{R}:4163-4164",
    "eval.enabled": "trainer/main.py:115-116 (installs EvalCallback)",
    "eval.num_generations": f"{R}:4228",
    "eval.temperature": f"{R}:728",
    "eval.top_p": f"{R}:729",
    "checkpointing.save_steps": "trainer/main.py:111",
    "checkpointing.save_total_limit": "trainer/main.py:112",
    "num_training_steps": f"{R}:3951",
    "seed": f"{R}:437 (vLLM's base seed), 1251 (prompt order when reward.shuffle_seed is unset)",
}
# Written before, dropped: nothing on that path reads them (or something else decides)
NOT_READ = {
    "policy.lr_decay_style": f"{R}:228 only, in the non-Ray setup (it returns at 166-168); {E}:1047 is constant",
    "policy.training.optimizer_dtype": f"{R}:179 (non-Ray), {W}:230 (FSDP branch only); {E}:742-744 is BF16",
    "quantization.rollout.precision": "quantization/fp8_config.py:44 (FP8TrainingManager, never built), "
                                      "workers/rollout_worker.py:45 (not the ray_http vLLM rollout)",
    VLLM + "update_weights_bucket_megabytes": f"{R}:771, the IPC sync; RDMA returns at 752-753",
    "moe.r3.replay_mode": "moe/r3_manager.py:44 (a debug message), workers/rollout_worker.py:52 (not this rollout)",
    "reward.function": f"workers/reward_worker.py:53 (RewardWorker, never built); the trainer calls "
                       f"compute_math_reward itself ({R}:2073, 2087)",
    "algorithm.use_kl_in_reward": f"{R}:348, in the non-Ray setup only",
    MEG + "num_experts": f"{E}:610-613: the checkpoint's config.json n_routed_experts wins",
}

# Where the recipe says otherwise than LumenRL's longrun file
POST_WINS = {
    "num_training_steps": (75, 200),   # the file says 200; run_grpo_dsv4.sh passes the step count, the post's 75
}
# the AMD recipe runs what the file at 2232f55 says (docs/fidelity.md): 0.92 GPU memory (the post writes 0.90) and
# validation every 5 steps (the post gives no interval) are the file's, so nothing else differs
RECIPE_DIFFERS: dict = {}
# where the data was staged is the site's: the recipe names verl's parquet, LumenRL's file a JSONL copy of the rows
SITE_PATHS = {
    "reward.dataset": ("/dev/shm/datasets/dapo-math-17k/dapo-math-17k.parquet",
                       "/dev/shm/datasets/dapo-math-17k/dapo-math-17k.jsonl"),
    "val_dataset": ("/dev/shm/datasets/aime-2024/aime-2024.parquet", "/dev/shm/datasets/aime-2024/aime-2024.jsonl"),
}


def test_every_key_written_is_one_lumenrls_deepseek_v4_path_reads():
    written = set(recipe_settings(load_recipe(AMD, ON_LUMENRL)))
    assert written == set(READ_AT)
    assert not written & set(NOT_READ)


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
    assert len(settings) == 72  # 77 before issue 26: 8 keys nothing reads dropped; the streamed optimizer's 2 and
    # vllm_cfg.disable_custom_all_reduce (rollout.disable_custom_all_reduce) added
    assert differences(settings, LONGRUN_2232F554) == {**POST_WINS, **RECIPE_DIFFERS, **SITE_PATHS}
    assert (settings[MEG + "streamed_optimizer_moment_dtype"], settings[MEG + "streamed_optimizer_mode"]) == \
        ("bf16", "adam")  # actor.optimizer_moment_dtype; full CPU offload, as streamed Adam requires


def test_post_wins_values_are_the_recipes():
    recipe = load_recipe(AMD)
    assert (recipe.rollout.gpu_memory_utilization, recipe.steps, recipe.eval.every_steps) == (0.92, 75, 5)


def test_a_recipe_stating_the_smoke_run_writes_the_published_smoke_values():
    smoke = load_recipe(AMD, ON_LUMENRL + [
        "steps=3", "algorithm.prompts_per_step=1", "lengths.max_context=512", "lengths.max_response=256",
        "actor.max_tokens_per_micro_batch=512", "actor.dtype=fp32", "rollout.max_num_seqs=32",
        "rollout.gpu_memory_utilization=0.92", "weight_sync.timeout_s=1200", "rollout_correction.mode=none",
        "eval.every_steps=9999", "eval.at_start=false", "eval.after_first_update=false",
        "actor.optimizer_moment_dtype=fp32",
        "checkpoint.every_steps=9999", "checkpoint.keep_last=1",
        "model.path=/root/models/DeepSeek-V4-Flash-BF16",
        "data.train.path=/dev/shm/datasets/dapo-math-17k/dapo-math-17k.jsonl",
        "data.eval.path=/dev/shm/datasets/aime-2024/aime-2024.jsonl"])
    settings = recipe_settings(smoke)
    assert "eval.num_generations" not in settings  # validation off: its knobs are not written
    # what no recipe can say: the schema's optimizer is Adam; with the whole optimizer state in host memory the
    # recipe streams Adam, as the longrun file does, where the smoke file leaves LumenRL's default, off
    assert differences(settings, SMOKE_B039BA2) == {"policy.optimizer_type": ("adam", "sgd"),
                                                    MEG + "streamed_optimizer_mode": ("adam", "off")}


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
                                            "actor.num_workers=12", "actor.tensor_parallel=2",
                                            "actor.expert_parallel=2", "actor.pipeline_parallel=2",
                                            "actor.num_layers_in_first_pipeline_stage=22",
                                            "actor.num_layers_in_last_pipeline_stage=21"])
    s = recipe_settings(recipe)
    assert (s["policy.training.megatron_cfg.num_layers_in_first_pipeline_stage"],
            s["policy.training.megatron_cfg.num_layers_in_last_pipeline_stage"]) == (22, 21)
    assert s["policy.generation.vllm_cfg.quantization"] == ""
    assert s["weight_sync.fp8_quantization_location"] is None  # LumenRL accepts a location only for fp8_per_block
    assert s["policy.training.megatron_cfg.recompute_granularity"] is None
    # eval.every_steps beyond the run: no in-loop validation; eval.after_first_update (on): the EvalCallback after
    # step 1, which samples with the eval.* settings
    assert (s["val_steps"], s["eval.enabled"], s["eval.top_p"]) == (0, True, 0.7)
    neither = recipe_settings(load_recipe(AMD, ON_LUMENRL + ["steps=20", "eval.every_steps=30",
                                                             "eval.after_first_update=false"]))
    assert (neither["val_steps"], neither["eval.enabled"]) == (0, False) and "eval.top_p" not in neither
    partial = recipe_settings(load_recipe(AMD, ON_LUMENRL + ["actor.optimizer_offload_fraction=0.5",
                                                             "actor.optimizer_moment_dtype=fp32"]))
    assert (partial[MEG + "streamed_optimizer_mode"], partial[MEG + "streamed_optimizer_moment_dtype"]) == \
        ("off", "fp32")  # LumenRL refuses streamed Adam without the whole state offloaded
    assert s["weight_sync.timeout_s"] == 91 and isinstance(s["weight_sync.timeout_s"], int)
    assert s["quantization.rollout_correction.rollout_is"] == "sequence"
    assert s["controller.ray.actor.process_on_nodes"] == [6, 6]
    fp8_on_trainer = load_recipe(AMD, ON_LUMENRL + ["weight_sync.quantize_on=trainer"])
    assert recipe_settings(fp8_on_trainer)["weight_sync.fp8_quantization_location"] == "trainer"


def test_notes_say_where_lumenrl_will_not_do_what_the_recipe_says():
    notes = config_notes(load_recipe(AMD, ON_LUMENRL + ["steps=30", "eval.at_start=true"]))
    assert len(notes) == 4 and "step 30 itself is not checkpointed" in notes[3]
    assert notes[0].startswith("seed=10086: LumenRL seeds vLLM and the prompt order from it, but its Megatron "
                               "trainer always from 42 (workers/actor_worker.py:305 reads policy.seed")
    assert notes[1].startswith("eval.at_start: LumenRL never evaluates before the first update")
    assert notes[2].startswith("lumenrl.actor_node_ips / rollout_node_ips: unset")
    # the AMD recipe as it stands has no step-0 evaluation, so no note about one
    assert not any(n.startswith("eval.at_start") for n in config_notes(load_recipe(AMD, ON_LUMENRL)))
    pinned = ["lumenrl.actor_node_ips=10.0.0.2,10.0.0.3", "lumenrl.rollout_node_ips=10.0.0.1", "eval.at_start=false"]
    assert [n.split(":")[0] for n in config_notes(load_recipe(AMD, ON_LUMENRL + pinned))] == ["seed=10086"]
    assert "validation is off" in config_notes(load_recipe(AMD, ON_LUMENRL + ["steps=4"]))[1]
    fp32 = config_notes(load_recipe(AMD, ON_LUMENRL + pinned + ["actor.dtype=fp32"]))
    assert fp32[1].startswith("actor.dtype=fp32: LumenRL's DeepSeek-V4 Megatron engine trains in BF16")


def test_the_written_config_says_where_lumenrl_ignores_the_recipe(tmp_path):
    """The notes travel in the written file's header (repro.lumenrl.run.prepare_config), so whoever reads the config
    LumenRL ran sees that its Megatron seed was not the recipe's."""
    from lumenrl_support import make_standin_checkout, standin_overrides
    from repro.lumenrl.run import prepare_config

    checkout = make_standin_checkout(tmp_path)
    recipe = load_recipe(AMD, standin_overrides(checkout, tmp_path / "inputs", 8, save_every=2, eval_every=4))
    path, _, _ = prepare_config(recipe, tmp_path / "run", resume=False)
    header = [line for line in path.read_text().splitlines() if line.startswith("#")]
    assert any(line.startswith("# Note: seed=10086: LumenRL seeds vLLM and the prompt order from it, but its "
                               "Megatron trainer always from 42") for line in header)
    written = yaml.safe_load(path.read_text())
    assert "lr_decay_style" in written["policy"]  # not written by the recipe: the base file's value stands
    assert written["policy"]["training"]["megatron_cfg"]["streamed_optimizer_moment_dtype"] == "bf16"


@pytest.mark.parametrize("overrides, expected", [
    (["engine=lumenrl"], "lumenrl.path: required when engine is lumenrl"),
    (ON_LUMENRL + ["algorithm.updates_per_step=2"], "algorithm.updates_per_step: LumenRL takes"),
    (ON_LUMENRL + ["algorithm.norm_adv_by_std=false"], "algorithm.norm_adv_by_std: LumenRL's grpo estimator always"),
    (ON_LUMENRL + ["algorithm.entropy_coef=0.01"], "algorithm.entropy_coef: LumenRL's GRPO config has no entropy"),
    (ON_LUMENRL + ["rollout_correction.mode=token_mask"], "rollout_correction.mode: 'token_mask' is not mapped"),
    (ON_LUMENRL + ["reward.verifier=math_verify"], "reward.verifier: LumenRL scores with"),
    (ON_LUMENRL + ["weight_sync.transport=ray_object_store"], "weight_sync.transport: LumenRL syncs"),
    (ON_LUMENRL + ["model.path=builtin:tiny-dsv4-warm"], "model.path: LumenRL loads a checkpoint folder"),
    # conventions LumenRL's code fixes: a recipe asking for verl's cannot be run by it
    (ON_LUMENRL + ["rollout.logprobs_mode=processed"], "rollout.logprobs_mode: LumenRL passes no logprobs_mode"),
    (ON_LUMENRL + ["algorithm.clip_ratio_c=3.0"], "algorithm.clip_ratio_c: LumenRL's GRPO loss on the Megatron path"),
    (ON_LUMENRL + ["algorithm.adv_std=sample"],
     "algorithm.adv_std: LumenRL's grpo estimator divides by the population"),
    (ON_LUMENRL + ["reward.boxed_fallback=false"], "reward.boxed_fallback: LumenRL's reward always scores"),
    (ON_LUMENRL + ["data.train.dedupe=true"], "data.train.dedupe: LumenRL reads every row"),
    (ON_LUMENRL + ["optim.weight_decay_rule=all"], "optim.weight_decay_rule: LumenRL's engine builds megatron's"),
    (ON_LUMENRL + ["data.chat_encoding=none"], "data.chat_encoding: LumenRL formats prompts"),
    (ON_LUMENRL + ["data.order=epochs"], "data.order: LumenRL reads the rows in one torch.randperm order"),
    (ON_LUMENRL + ["rollout.requests=per_prompt"], "rollout.requests: LumenRL sends each prompt once per response"),
    (ON_LUMENRL + ["data.eval.template=dapo"], "data.eval.template: LumenRL prompts with the row's messages"),
    (ON_LUMENRL + ["eval.answer_format=false"], "eval.answer_format: LumenRL's evaluation always appends"),
])
def test_what_lumenrl_cannot_run_is_refused_naming_the_field(overrides, expected):
    with pytest.raises(RecipeError) as err:
        load_recipe(AMD, overrides)
    assert expected in str(err.value)


def test_the_tiny_recipe_on_lumenrl_names_every_field_at_fault():
    with pytest.raises(RecipeError) as err:
        load_recipe("tiny-cpu", ON_LUMENRL)
    fields = [line.strip().split(":")[0] for line in str(err.value).splitlines()[1:]]
    assert fields == ["actor.backend", "rollout.backend", "weight_sync.transport", "data.order", "rollout.requests",
                      "data.chat_encoding",
                      "data.train.template", "data.eval.template", "eval.answer_format", "data.train.kind",
                      "data.eval.kind", "model.path"]


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
