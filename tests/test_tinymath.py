"""tiny-math: problem counts, the carry/borrow rule, the fixed held-out set, and the DAPO row layout."""

import pandas as pd
import pytest

from repro.data.tinymath import (
    TINY_ALPHABET, Arithmetic, all_problems, held_out_problems, to_dapo_row, train_problems, write_tiny_math,
)


def test_problem_counts_by_difficulty():
    assert len(all_problems(1)) == 100 + 55
    assert len(all_problems(2)) == 10_000 + 5_050
    assert len(all_problems(2, ops=("+",))) == 10_000
    with pytest.raises(ValueError, match="digits must be 1, 2 or 3"):
        all_problems(4)
    with pytest.raises(ValueError, match=r"ops may only contain"):
        all_problems(2, ops=("*",))


@pytest.mark.parametrize(
    "a, op, b, text, answer, hard",
    [
        (37, "+", 5, "37+05", "42", True),    # 7 + 5 carries
        (32, "+", 5, "32+05", "37", False),
        (95, "+", 10, "95+10", "105", True),  # tens column carries into hundreds
        (30, "-", 5, "30-05", "25", True),    # 0 - 5 borrows
        (35, "-", 5, "35-05", "30", False),
        (50, "-", 50, "50-50", "0", False),
        (10, "-", 9, "10-09", "1", True),
    ],
)
def test_problem_text_answer_and_carry(a, op, b, text, answer, hard):
    p = Arithmetic(a, op, b)
    assert (p.problem, p.answer, p.needs_carry_or_borrow) == (text, answer, hard)


def test_held_out_is_fixed_hard_and_disjoint():
    held = held_out_problems()
    assert len(held) == 30 and all(p.needs_carry_or_borrow for p in held)
    assert [p.op for p in held].count("+") == 15
    assert [(p.problem, p.answer) for p in held[:3]] == [("64+85", "149"), ("29+73", "102"), ("89+35", "124")]
    assert held == held_out_problems()  # independent of any run seed
    train = train_problems()
    assert len(train) == 15_050 - 30 and not set(held) & set(train)
    assert train_problems(seed=1) != train and sorted(map(str, train_problems(seed=1))) == sorted(map(str, train))


def test_prompts_are_fixed_width_and_inside_the_alphabet():
    rows = [to_dapo_row(p, i, "train") for i, p in enumerate(train_problems(n=200))]
    assert {len(r["prompt"][0]["content"]) for r in rows} == {6}
    assert set("".join(r["prompt"][0]["content"] + "Answer: " + r["reward_model"]["ground_truth"] for r in rows)) \
        <= set(TINY_ALPHABET)


def test_written_parquet_has_the_dapo_layout(tmp_path):
    paths = write_tiny_math(tmp_path, digits=1)
    train = pd.read_parquet(paths["train"])
    assert list(train.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert len(train) == 155 - 30 and len(pd.read_parquet(paths["held_out"])) == 30
    row = train.iloc[0]
    assert row["prompt"][0]["role"] == "user" and row["reward_model"]["style"] == "rule"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["held_out.parquet", "train.parquet"]
