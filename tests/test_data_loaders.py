"""Loaders for DAPO-Math-17K / AIME-2024 layouts (repro/data/loaders.py) and prompt rendering (records.py).

Every file is written here, in tmp_path, in the layouts the real releases use.
"""

import dataclasses
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from repro.data.loaders import load_aime2024, load_dapo_math, load_problems
from repro.data.records import (
    DAPO_PROMPT_TEMPLATE,
    RAW_PROMPT_TEMPLATE,
    ChatMessage,
    MathProblem,
    render_messages,
    render_prompt,
    split_template,
    strip_template,
)
from repro.errors import DataError, RecipeError

DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
PROBLEMS = ["What is $1+1$?", "Compute $\\frac{6}{3}$.", "Find $x$ if $x^{2} = 9$ and $x > 0$."]
ANSWERS = ["2", "2", "3"]


def dapo_row(problem, answer, index, templated=True, source="math_dapo"):
    content = DAPO_PREFIX + problem + DAPO_SUFFIX if templated else problem
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": content}],
        "ability": "MATH",
        "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": index},
    }


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def repeated_dapo_rows():
    # problem 0 four times, problem 1 three times, problem 2 once, interleaved as in the release
    order = [0, 1, 0, 2, 1, 0, 1, 0]
    return [dapo_row(PROBLEMS[p], ANSWERS[p], f"uid-{i}") for i, p in enumerate(order)]


def test_dapo_template_is_verbatim():
    assert DAPO_PROMPT_TEMPLATE == DAPO_PREFIX + "{problem}" + DAPO_SUFFIX


def test_dapo_parquet_dedupes_and_strips_the_template(tmp_path):
    loaded = load_dapo_math(write_parquet(tmp_path / "dapo.parquet", repeated_dapo_rows()))
    assert [p.problem for p in loaded.problems] == PROBLEMS
    assert [p.ground_truth for p in loaded.problems] == ANSWERS
    assert [p.uid for p in loaded.problems] == ["uid-0", "uid-1", "uid-3"]
    assert loaded.problems[0].data_source == "math_dapo"
    assert loaded.problems[0].prompt_messages == (ChatMessage("user", DAPO_PREFIX + PROBLEMS[0] + DAPO_SUFFIX),)
    stats = loaded.stats
    assert (stats.layout, stats.rows_read, stats.kept, stats.duplicates_dropped) == ("dapo", 8, 3, 5)
    assert (stats.answer_conflicts, stats.malformed_skipped, stats.first_malformed) == (0, 0, ())
    assert "8 rows read, 3 problems kept, 5 duplicates dropped" in stats.summary()


def test_jsonl_gives_the_same_records_as_parquet(tmp_path):
    rows = repeated_dapo_rows()
    from_parquet = load_dapo_math(write_parquet(tmp_path / "d.parquet", rows))
    from_jsonl = load_dapo_math(write_jsonl(tmp_path / "d.jsonl", rows))
    assert from_jsonl.problems == from_parquet.problems
    assert from_jsonl.stats.duplicates_dropped == 5


def test_raw_and_templated_copies_of_a_problem_are_one_problem(tmp_path):
    rows = [
        dapo_row(PROBLEMS[0], "2", 0, templated=False),
        dapo_row(PROBLEMS[0], "2", 1),
        dapo_row(PROBLEMS[1], "2", 2, templated=False),
    ]
    loaded = load_dapo_math(write_parquet(tmp_path / "mixed.parquet", rows))
    assert [p.problem for p in loaded.problems] == PROBLEMS[:2]
    assert loaded.stats.duplicates_dropped == 1


def test_duplicate_with_a_different_answer_is_counted_as_a_conflict(tmp_path):
    rows = [dapo_row(PROBLEMS[0], "2", 0), dapo_row(PROBLEMS[0], "3", 1), dapo_row(PROBLEMS[0], "2", 2)]
    loaded = load_dapo_math(write_parquet(tmp_path / "conflict.parquet", rows))
    assert [p.ground_truth for p in loaded.problems] == ["2"]  # the first row wins
    assert (loaded.stats.duplicates_dropped, loaded.stats.answer_conflicts) == (2, 1)


def malformed_jsonl_rows():
    good = dapo_row(PROBLEMS[0], "2", 0)
    no_answer = dapo_row(PROBLEMS[1], "2", 1)
    del no_answer["reward_model"]["ground_truth"]
    empty_prompt = {**dapo_row(PROBLEMS[1], "2", 2), "prompt": []}
    prompt_is_string = {**dapo_row(PROBLEMS[1], "2", 3), "prompt": PROBLEMS[1]}
    answer_is_list = dapo_row(PROBLEMS[1], ["2"], 4)
    no_source = {k: v for k, v in dapo_row(PROBLEMS[1], "2", 5).items() if k != "data_source"}
    extra_is_list = {**dapo_row(PROBLEMS[1], "2", 6), "extra_info": [1]}
    empty_problem = dapo_row("   ", "2", 7)
    other = dapo_row(PROBLEMS[2], "3", 8)
    bad = [no_answer, empty_prompt, prompt_is_string, answer_is_list, no_source, extra_is_list, "{not json",
           empty_problem]
    return [good, *bad, other]


def test_malformed_rows_are_skipped_and_reported(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", malformed_jsonl_rows())
    loaded = load_dapo_math(path, on_malformed="skip")
    assert [p.uid for p in loaded.problems] == ["0", "8"]
    assert (loaded.stats.rows_read, loaded.stats.kept, loaded.stats.malformed_skipped) == (10, 2, 8)
    reported = [(m.row, m.field) for m in loaded.stats.first_malformed]
    assert reported == [
        (1, "reward_model.ground_truth"),
        (2, "prompt"),
        (3, "prompt"),
        (4, "reward_model.ground_truth"),
        (5, "data_source"),
    ]
    assert all(m.file == str(path) for m in loaded.stats.first_malformed)
    assert str(loaded.stats.first_malformed[3]) == (
        f"{path}: row 4: field 'reward_model.ground_truth' must be a string or an integer, got list"
    )


def test_malformed_row_fails_naming_file_row_and_field(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", malformed_jsonl_rows())
    with pytest.raises(DataError) as raised:
        load_dapo_math(path, on_malformed="fail")
    assert str(raised.value) == f"{path}: row 1: field 'reward_model.ground_truth' is missing"


def test_invalid_json_and_empty_problem_are_reported_by_line(tmp_path):
    rows = malformed_jsonl_rows()
    path = write_jsonl(tmp_path / "late.jsonl", [rows[0], "", rows[7], rows[8]])  # line 1 is blank
    loaded = load_dapo_math(path)
    assert [(m.row, m.field) for m in loaded.stats.first_malformed] == [(2, "<row>"), (3, "prompt[0].content")]
    assert loaded.stats.rows_read == 3  # blank lines are not rows


def test_parquet_null_answer_empty_prompt_and_missing_column(tmp_path):
    rows = repeated_dapo_rows()[:3]
    rows[1]["reward_model"]["ground_truth"] = None
    rows[2]["prompt"] = []
    path = write_parquet(tmp_path / "nulls.parquet", rows)
    with pytest.raises(DataError, match=r"nulls\.parquet: row 1: field 'reward_model\.ground_truth' is missing"):
        load_dapo_math(path, on_malformed="fail")
    reported = [(m.row, m.field) for m in load_dapo_math(path).stats.first_malformed]
    assert reported == [(1, "reward_model.ground_truth"), (2, "prompt")]
    without_answers = [{k: v for k, v in r.items() if k != "reward_model"} for r in repeated_dapo_rows()]
    no_column = write_parquet(tmp_path / "nocol.parquet", without_answers)
    with pytest.raises(DataError, match=r"nocol\.parquet: row 0: field 'reward_model' is missing"):
        load_dapo_math(no_column, on_malformed="fail")
    with pytest.raises(DataError,
                       match=r"nocol\.parquet: no usable rows \(8 read, 8 malformed\); first malformed: .*row 0"):
        load_dapo_math(no_column, on_malformed="skip")


def test_aime_simple_layout_parquet_with_integer_answers(tmp_path):
    rows = [{"id": 60 + i, "problem": f"AIME problem {i}", "answer": 100 + i, "url": "u"} for i in range(30)]
    loaded = load_aime2024(write_parquet(tmp_path / "aime_2024.parquet", rows))
    assert loaded.stats.layout == "simple"
    assert (loaded.stats.kept, loaded.stats.duplicates_dropped) == (30, 0)
    first = loaded.problems[0]
    assert (first.uid, first.problem, first.ground_truth, first.data_source) == \
        ("60", "AIME problem 0", "100", "aime2024")
    assert first.prompt_messages == () and dict(first.extra_info) == {"id": 60, "url": "u"}


def test_aime_capitalised_jsonl_with_string_answers(tmp_path):
    rows = [{"ID": f"2024-I-{i}", "Problem": f"P{i}", "Answer": f"{i:03d}"} for i in range(1, 31)]
    loaded = load_aime2024(write_jsonl(tmp_path / "aime.jsonl", rows))
    assert [p.uid for p in loaded.problems[:2]] == ["2024-I-1", "2024-I-2"]
    assert loaded.problems[-1].ground_truth == "030"
    assert loaded.stats.kept == 30


def test_aime_simple_layout_malformed_answer(tmp_path):
    rows = [{"problem": "P1", "answer": 1}, {"problem": "P2", "answer": True}, {"problem": "P3"}]
    path = write_jsonl(tmp_path / "aime_bad.jsonl", rows)
    assert [(m.row, m.field) for m in load_aime2024(path).stats.first_malformed] == [(1, "answer"), (2, "answer")]
    with pytest.raises(DataError,
                       match=r"aime_bad\.jsonl: row 1: field 'answer' must be a string or an integer, got bool"):
        load_aime2024(path, on_malformed="fail")


def test_aime_960_row_dapo_repeat_dedupes_to_30(tmp_path):
    rows = [dapo_row(f"AIME problem {i % 30}", str(i % 30), i, source="math_dapo") for i in range(960)]
    loaded = load_aime2024(write_parquet(tmp_path / "aime_960.parquet", rows))
    assert loaded.stats.layout == "dapo"
    assert (loaded.stats.rows_read, loaded.stats.kept, loaded.stats.duplicates_dropped) == (960, 30, 930)
    assert [p.problem for p in loaded.problems] == [f"AIME problem {i}" for i in range(30)]


def test_file_level_errors(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_dapo_math(tmp_path / "absent.parquet")
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(DataError, match=r"data\.csv: unknown dataset format '\.csv'"):
        load_dapo_math(tmp_path / "data.csv")
    (tmp_path / "fake.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"fake\.parquet: not a readable parquet file"):
        load_dapo_math(tmp_path / "fake.parquet")
    with pytest.raises(DataError, match=r"cols\.jsonl: row 0: unrecognised layout; columns are \['q', 'z'\]"):
        load_aime2024(write_jsonl(tmp_path / "cols.jsonl", [{"q": 1, "z": 2}]))
    with pytest.raises(RecipeError, match="on_malformed must be one of"):
        load_problems(tmp_path / "cols.jsonl", on_malformed="ignore")


def test_rendering_round_trips_the_stored_prompt(tmp_path):
    loaded = load_dapo_math(write_parquet(tmp_path / "d.parquet", repeated_dapo_rows()))
    problem = loaded.problems[1]
    assert render_prompt(problem) == DAPO_PREFIX + "Compute $\\frac{6}{3}$." + DAPO_SUFFIX
    assert render_prompt(problem, RAW_PROMPT_TEMPLATE) == "Compute $\\frac{6}{3}$."
    assert render_prompt(problem, "Q: {problem} \\boxed{}") == "Q: Compute $\\frac{6}{3}$. \\boxed{}"
    with_system = dataclasses.replace(problem,
                                      prompt_messages=(ChatMessage("system", "be brief"), *problem.prompt_messages))
    assert render_messages(with_system, RAW_PROMPT_TEMPLATE) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "Compute $\\frac{6}{3}$."},
    ]
    bare = MathProblem(uid="a", problem="1+1", ground_truth="2", data_source="x")
    assert render_messages(bare, "{problem}=") == [{"role": "user", "content": "1+1="}]


def test_template_helpers_and_record_immutability():
    assert strip_template("12+34=", ("{problem}=",)) == ("12+34", True)
    assert strip_template(" plain text ") == ("plain text", False)
    with pytest.raises(RecipeError, match="exactly once, found 0 times"):
        split_template("no placeholder")
    record = MathProblem(uid="a", problem="p", ground_truth="1", data_source="s", extra_info={"index": 3})
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.problem = "q"
    with pytest.raises(TypeError):
        record.extra_info["index"] = 4


def test_tiny_math_files_load_through_the_same_loader(tmp_path):
    from repro.data.tinymath import TINY_PROMPT_TEMPLATE, write_tiny_math

    paths = write_tiny_math(tmp_path, digits=2)
    train = load_dapo_math(paths["train"], templates=(TINY_PROMPT_TEMPLATE,))
    held_out = load_dapo_math(paths["held_out"], templates=(TINY_PROMPT_TEMPLATE,))
    assert (train.stats.kept, train.stats.duplicates_dropped, held_out.stats.kept) == (15_020, 0, 30)
    assert not {p.problem for p in train.problems} & {p.problem for p in held_out.problems}
    first = train.problems[0]
    assert render_prompt(first, TINY_PROMPT_TEMPLATE) == first.prompt_messages[0].content


def test_a_recipe_dataset_writes_only_its_split_and_batched_prompt_ids_equal_one_by_one(tmp_path):
    from repro.data.recipe_datasets import all_prompt_ids, load_dataset, prompt_ids
    from repro.data.tinymath import write_tiny_math
    from repro.model.hf_folder import load_tiny_tokenizer
    from repro.recipes import load_recipe
    from repro.run.run_dir import resolve_model_dir

    recipe = load_recipe("tiny-cpu")
    held_out = load_dataset(recipe.data.eval, tmp_path, seed=3)
    assert [p.name for p in tmp_path.iterdir()] == ["held_out.parquet"] and len(held_out) == 30
    train = load_dataset(recipe.data.train, tmp_path, seed=3)[:500]
    tokenizer = load_tiny_tokenizer(resolve_model_dir(recipe))
    batched = all_prompt_ids(tokenizer, train + held_out, "tiny")
    assert batched == [prompt_ids(tokenizer, p, "tiny") for p in train + held_out]
    assert batched[0][0] == tokenizer.bos_token_id and all_prompt_ids(tokenizer, [], "tiny") == []
    with pytest.raises(ValueError, match="unknown split"):
        write_tiny_math(tmp_path, splits=("test",))
