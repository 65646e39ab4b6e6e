"""engine: verl, repro's side without verl installed (verl's own code checks our configs in tests/verl, the verl lane):
the mapping covers every recipe field once, unexpressible values are refused naming the field, the AMD recipe runs
with its departures stated in numbers, the overrides' values, verl's data layout, the reward, the resume rule, the
metrics stream from verl's file-logger format (tests/data/verl/metrics.jsonl, hand-written in verl's shape: a
stand-in for a real verl run that does not cover verl's own writing; the lane streams verl's own Tracking), and the
dry runs of the three verl recipes."""

import json
import math
import warnings

import pandas as pd
import pytest

from repro.analysis.frame import frames_from_rows
from repro.analysis.importers import read_verl_jsonl
from repro.errors import RecipeError
from repro.recipes import load_recipe
from repro.recipes.schema import Recipe
from repro.run.metrics_log import MetricsLog
from repro.verl import data as verl_data, overrides as ov
from repro.verl.checkpoints import TRACKER, incomplete, latest_verl_checkpoint
from repro.verl.mapping import MAPPING, departures
from repro.verl.reward_fn import compute_score
from repro.verl.run import plan_verl_run
from repro.verl.stream import VerlStream, parse_console_line

AMD = "amd-dsv4-flash-mi308x"
VERL_JSONL = "tests/data/verl/metrics.jsonl"


def _leaves(model, prefix=""):
    out = []
    for name, field in model.model_fields.items():
        sub = field.annotation
        out += _leaves(sub, f"{prefix}{name}.") if isinstance(sub, type) and hasattr(sub, "model_fields") else [
            prefix + name]
    return out


def test_every_recipe_field_is_mapped_refused_or_a_departure_exactly_once():
    leaves = _leaves(Recipe)
    covering = {leaf: [r.field for r in MAPPING if r.field == leaf or (r.field.endswith(".*")
                                                                       and leaf.startswith(r.field[:-1]))]
                for leaf in leaves}
    assert {leaf: rows for leaf, rows in covering.items() if len(rows) != 1} == {}
    assert {r.status for r in MAPPING} == {"mapped", "departure", "ours"}
    assert len(leaves) == 158  # 152 + data.order, data.chat_encoding, eval.answer_format, rollout.requests,
    #                             optim.weight_decay_rule (issue 42) + actor.bf16_gemm (issue 41)


def test_amd_recipe_runs_on_verl_with_its_departures_in_numbers():
    recipe = load_recipe(AMD, ["engine=verl"])
    notes = departures(recipe)
    assert any("0.935" in n for n in notes) and round(math.sqrt(7 / 8), 3) == 0.935
    assert any(n.startswith("layout:") and "16 GPUs" in n and "separate_async" in n for n in notes)
    assert any(n.startswith("eval.after_first_update") for n in notes)


@pytest.mark.parametrize("setting, field", [
    ("actor.dtype=fp32", "actor.dtype"), ("rollout.fp8_scale=ue8m0", "rollout.fp8_scale"),
    ("rollout.activation_quant=none", "rollout.activation_quant"), ("rollout.fp8_block=[64,64]", "rollout.fp8_block"),
    ("rollout.activation_group=64", "rollout.activation_group"), ("rollout.activation_dtype=fp32",
                                                                  "rollout.activation_dtype"),
    ("weight_sync.quantize_on=trainer", "weight_sync.quantize_on"), ("algorithm.kl_coef=0.01", "algorithm.kl_coef"),
    ("algorithm.updates_per_step=3", "algorithm.updates_per_step"), ("verl.nodes=4", "verl.nodes"),
    ("verl.nodes=3", "actor.num_workers"),
    ("reward.verifier=math_verify", "reward.verifier"),
])
def test_each_value_verl_cannot_express_is_refused_naming_its_field(setting, field):
    with pytest.raises(RecipeError, match=rf"\n  {field.replace('.', '[.]')}: "):
        load_recipe(AMD, ["engine=verl", setting])


def test_the_amd_recipes_overrides_say_amds_conventions_in_verls_keys():
    keys = ov.recipe_overrides(load_recipe(AMD, ["engine=verl"]))
    assert keys["actor_rollout_ref.rollout.logprobs_mode"] == "raw_logprobs"
    assert keys["actor_rollout_ref.actor.clip_ratio_c"] == 1e9 > math.exp(20)  # verl clamps log-ratios at 20
    assert (keys["algorithm.rollout_correction.rollout_is"], keys["algorithm.rollout_correction.rollout_is_threshold"]
            ) == ("token", 2.0)
    assert keys["actor_rollout_ref.actor.megatron.router_replay.mode"] == "R3"
    assert keys["actor_rollout_ref.rollout.enable_rollout_routing_replay"] is True
    assert keys["actor_rollout_ref.rollout.quantization"] == "fp8"
    assert keys["+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype"] == "fp8_e4m3"
    assert (keys["trainer.test_freq"], keys["trainer.save_freq"], keys["trainer.total_training_steps"]) == (5, 25, 75)
    optim = "+actor_rollout_ref.actor.optim.override_optimizer_config."
    assert (keys[optim + "adam_beta1"], keys[optim + "adam_beta2"], keys[optim + "adam_eps"]) == (0.9, 0.98, 1e-8)
    assert not any(k.endswith("optim.betas") for k in keys)  # ignored on verl's Megatron path
    assert (keys["data.train_batch_size"], keys["actor_rollout_ref.rollout.n"]) == (32, 8)
    assert keys["data.max_prompt_length"] + keys["data.max_response_length"] == 16384
    masked = ov.recipe_overrides(load_recipe(AMD, ["engine=verl", "rollout_correction.mode=token_mask"]))
    assert masked["algorithm.rollout_correction.rollout_is_threshold"] == "0.5_2.0"  # verl's IcePop 'lower_upper'


def test_hydra_values_are_quoted_when_hydras_grammar_would_read_them_otherwise():
    assert [ov.hydra_value(v) for v in (None, True, 3, 1e-06, [1, "a b"], "/x/y.parquet", "1.0", "null", "a=b")] == [
        "null", "True", "3", "1e-06", "[1,'a b']", "/x/y.parquet", "'1.0'", "'null'", "'a=b'"]
    assert ov.hydra_value("it's") == "'it\\'s'"


def test_resume_takes_the_newest_complete_checkpoint_and_names_the_half_written_one(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (2, 4, 6):
        (root / f"global_step_{step}" / "actor").mkdir(parents=True)
        if step < 6:
            (root / f"global_step_{step}" / "data.pt").write_bytes(b"")
    assert latest_verl_checkpoint(root) is None  # no tracker: verl's 'auto' would start over; we resume nothing
    (root / TRACKER).write_text("4")
    assert latest_verl_checkpoint(root).step == 4
    assert incomplete(root) == ["global_step_6 (no data.pt)"]
    (root / "global_step_6" / "data.pt").write_bytes(b"")
    assert latest_verl_checkpoint(root).step == 4 and "written after the tracker" in incomplete(root)[0]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rows = [json.dumps({"kind": "train", "step": s}) + "\n" for s in range(1, 7)]
    (run_dir / "metrics.jsonl").write_text("".join(rows))
    recipe = load_recipe(AMD, ["engine=verl", f"verl.checkpoint_dir={root}"])
    plan = plan_verl_run(recipe, run_dir, resume=True)
    assert (plan.checkpoint.step, plan.dropped_steps, plan.ignored[0].startswith("global_step_6")) == (4, [5, 6], True)


def _stream_file(lines: list[str], tmp_path, console_lines=()):
    jsonl, console = tmp_path / "attempt.jsonl", tmp_path / "console.log"
    console.write_text("".join(console_lines))
    metrics = MetricsLog(tmp_path / "metrics.jsonl")
    seen = []
    stream = VerlStream(jsonl, console, metrics, lambda step, row: seen.append(step))
    if lines:
        jsonl.write_text("")
    for line in lines:  # as verl appends them, one poll per line, with a poll on a half-written line between
        with open(jsonl, "a") as handle:
            handle.write(line[:10])
        stream.poll()
        with open(jsonl, "a") as handle:
            handle.write(line[10:])
        stream.poll()
    stream.finish()
    return metrics, seen


def test_streaming_verls_file_gives_the_frames_reading_the_finished_file_gives(tmp_path):
    lines = open(VERL_JSONL).read().splitlines(keepends=True)
    metrics, seen = _stream_file(lines, tmp_path)
    streamed = frames_from_rows(list(metrics.rows()), metrics.path)
    finished = read_verl_jsonl(VERL_JSONL)
    assert seen == sorted(finished.train.index) == list(range(1, 7))
    pd.testing.assert_frame_equal(streamed.train[sorted(finished.train.columns)],
                                  finished.train[sorted(finished.train.columns)], check_dtype=False)
    pd.testing.assert_frame_equal(streamed.eval[sorted(finished.eval.columns)],
                                  finished.eval[sorted(finished.eval.columns)], check_dtype=False)
    assert list(streamed.eval.index) == [0, 3, 6]


def test_without_the_file_the_console_lines_are_read_numpy_reprs_ray_prefix_and_colours_included(tmp_path):
    console = ["(TaskRunner pid=41) Creating rollout workers\n",
               "\x1b[36m(TaskRunner pid=41)\x1b[0m step:1 - actor/pg_loss:np.float64(-0.25) - critic/score/mean:"
               "np.float64(0.5) - training/global_step:1 - timing_s/step:np.float64(12.5) - actor/grad_norm:nan\n"]
    metrics, seen = _stream_file([], tmp_path, console)
    (row,) = list(metrics.rows())
    assert seen == [1] and row["actor/loss"] == -0.25 and row["reward/accuracy"] == 0.75
    assert row["timing_s/step"] == 12.5 and row["actor/grad_norm"] is None
    assert parse_console_line("step: 3 said the scheduler") is None


def test_data_is_written_in_verls_parquet_layout_and_aime_deduplicated(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    dapo = [{"data_source": "math_dapo", "prompt": [{"role": "user", "content": f"What is {i}+{i}?"}],
             "ability": "MATH", "reward_model": {"ground_truth": str(2 * i), "style": "rule-lighteval/MATH_v2"},
             "extra_info": {"index": f"u{i}"}} for i in range(4)]
    aime = [{"problem": f"AIME problem {i % 3}", "answer": str(i % 3), "id": i % 3} for i in range(6)]
    pq.write_table(pa.Table.from_pylist(dapo), tmp_path / "dapo.parquet")
    pq.write_table(pa.Table.from_pylist(aime), tmp_path / "aime.parquet")
    recipe = load_recipe(AMD, ["engine=verl", f"data.train.path={tmp_path / 'dapo.parquet'}",
                               f"data.eval.path={tmp_path / 'aime.parquet'}"])
    train, val, n_train, n_val = verl_data.write_datasets(recipe, tmp_path / "out")
    assert (n_train, n_val) == (4, 3)
    row = pq.read_table(train).to_pylist()[1]
    assert row["data_source"] == "math_dapo" and row["reward_model"] == {"style": "rule", "ground_truth": "2"}
    # AMD's recipe takes the row's messages as stored (data.train.template: stored), as LumenRL does
    assert row["prompt"] == [{"role": "user", "content": "What is 1+1?"}]
    # evaluation: the bare AIME problem with LumenRL's answer-format line (eval.answer_format)
    (first, *_) = pq.read_table(val).to_pylist()
    assert first["prompt"][-1]["content"].startswith("AIME problem 0")
    assert first["prompt"][-1]["content"].endswith("Put the final answer on its own line as: Answer: \\boxed{answer}.")
    assert not list((tmp_path / "out").glob(".*.tmp"))


def test_the_reward_is_ours_with_lumenrls_boxed_fallback():
    assert compute_score("math_dapo", "so the answer is \\boxed{ 12 }", "12")["score"] == 1.0
    assert compute_score("math_dapo", "so \\boxed{ 12 }", "12", boxed_fallback=False)["score"] == -1.0
    assert compute_score("math_dapo", "work...\nAnswer: 12", "12") == {"score": 1.0, "acc": True, "pred": "12"}


@pytest.mark.parametrize("name", ["h100-8x8-dsv4-flash-verl", "moonlight-16b-1x8-verl", AMD])
def test_dry_run_prints_placement_overrides_beside_the_published_script_and_the_memory_budget(name, capsys, tmp_path):
    from repro.commands import launch
    import argparse

    parser = argparse.ArgumentParser()
    launch.add_arguments(parser)
    sets = ["--set", "engine=verl"] if name == AMD else []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert launch.run(parser.parse_args(["--recipe", name, "--dry-run", "--run-dir", str(tmp_path), *sets])) == 0
    out = capsys.readouterr().out
    assert "placement (verl's synchronous trainer, rollout colocated)" in out
    assert "verl's examples/grpo_trainer/run_deepseek_v4_flash_megatron.sh" in out
    assert "actor_rollout_ref.actor.megatron.grad_offload" in out and "<- only the script's" in out
    assert "GB per trainer rank (estimate)" in out and "fits: every rank within its device" in out
    assert not (tmp_path / "verl").exists()  # a dry run writes nothing


def test_docs_show_the_mapping_table_the_code_uses():
    from pathlib import Path

    from repro.verl.mapping import markdown_table

    assert markdown_table() in Path("docs/verl.md").read_text()


def test_fresh_on_a_verl_run_dir_removes_nothing_it_did_not_make(tmp_path):
    """engine: verl follows the run-folder rules of issue 39 (repro.run.folder): fresh on a folder that is not a run
    is refused before anything starts, every byte left as it was."""
    from repro.owned import NotOurs
    from repro.verl.run import plan_verl_run

    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "chapter1.tex").write_text("mine")
    with pytest.raises(NotOurs, match="is not a run folder .*chapter1.tex.*fresh removed nothing"):
        plan_verl_run(load_recipe(AMD, ["engine=verl"]), mine, fresh=True)
    assert [p.name for p in mine.iterdir()] == ["chapter1.tex"] and (mine / "chapter1.tex").read_text() == "mine"
