"""Prompts as AMD's run made them: DeepSeek-V4's encoder (thinking mode) over the row's stored messages, LumenRL's
answer-format line on held-out prompts, tokenized without added special tokens.

The reference is recorded, not live: tests/data/lumenrl/prompt_renderings.json holds what LumenRL 2232f55's own
``_extract_prompt_gt``/``_format_chat_prompt`` made of six rows with vLLM 0.25.1's encoder (written by
benchmarks/lumenrl_prompt_equivalence.py, which also compares 20,000 random conversations against that encoder: 0
differ). The tokenizers below are STAND-INS: a character-level fast tokenizer given DeepSeek-V4's special tokens
(it does not cover the release's BPE merges, only that the turn tokens come out as single ids and nothing is added).
"""

from __future__ import annotations

import json

import pytest

from repro import REPO_DIR
from repro.data.chat_encoding import BOS, encode_deepseek_v4
from repro.data.loaders import load_problems
from repro.data.recipe_datasets import all_prompt_ids, prompt_messages, prompt_text, resolved_encoding
from repro.errors import DataError, RecipeError
from repro.model.tokenizer import build_tiny_tokenizer

RECORDED = json.loads((REPO_DIR / "tests/data/lumenrl/prompt_renderings.json").read_text())


def load_rows(tmp_path, rows):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_problems(path, layout="auto", on_malformed="fail", dedupe=False).problems


@pytest.mark.parametrize("case", RECORDED["cases"], ids=[c["name"] for c in RECORDED["cases"]])
def test_the_amd_recipes_prompt_is_lumenrls(case, tmp_path):
    """The AMD recipe's settings (template stored, chat_encoding -> deepseek_v4, eval.answer_format) on the rows
    LumenRL rendered: the same text, and the same ground truth."""
    (problem,) = load_rows(tmp_path, [case["row"]])
    messages = prompt_messages(problem, "stored", answer_format=case["split"] == "eval")
    assert prompt_text(None, messages, "deepseek_v4") == case["lumenrl_prompt"]
    assert problem.ground_truth == case["lumenrl_ground_truth"]


def test_recorded_renderings_say_what_made_them():
    assert "2232f55" in RECORDED["lumenrl"] and RECORDED["encoder"].startswith("vLLM 0.25.1")
    aime = next(c for c in RECORDED["cases"] if c["name"] == "aime_row_bare_problem")["lumenrl_prompt"]
    assert aime.startswith(BOS + "<｜User｜>There exist") and aime.endswith(
        "Find $xy$.\n\nPut the final answer on its own line as: Answer: \\boxed{answer}.<｜Assistant｜><think>")
    dapo_aime = next(c for c in RECORDED["cases"] if c["name"] == "aime_row_dapo_layout")["lumenrl_prompt"]
    assert "Put the final answer" not in dapo_aime  # its DAPO instruction already holds 'Answer:'


def test_encoder_rules_on_hand_built_turns():
    assert encode_deepseek_v4([{"role": "user", "content": "q"}]) == BOS + "<｜User｜>q<｜Assistant｜><think>"
    # an assistant turn after the last user turn keeps its reasoning, closed by </think>, then EOS; nothing follows
    assert encode_deepseek_v4([{"role": "user", "content": "q"},
                               {"role": "assistant", "content": "a", "reasoning": "r"}]) == (
        BOS + "<｜User｜>q<｜Assistant｜><think>r</think>a<｜end▁of▁sentence｜>")
    # a system turn after a user turn: no assistant marker between them
    assert encode_deepseek_v4([{"role": "user", "content": "q"}, {"role": "system", "content": "s"},
                               {"role": "user", "content": "p"}]) == (
        BOS + "<｜User｜>q" + "s" + "<｜User｜>p<｜Assistant｜><think>")


@pytest.mark.parametrize("message, match", [
    ({"role": "tool", "content": "x"}, "role 'tool' is not encoded"),
    ({"role": "developer", "content": "x"}, "role 'developer' is not encoded"),
    ({"role": "user", "content": "x", "tools": [{"type": "function"}]}, "key 'tools' is not encoded"),
    ({"role": "user", "content": 3}, "content must be a string"),
])
def test_what_the_encoder_does_not_render_is_refused_naming_it(message, match):
    with pytest.raises(DataError, match=f"message 1.*{match}"):
        encode_deepseek_v4([{"role": "user", "content": "first"}, message])


def dsv4_stand_in():
    """STAND-IN for DeepSeek-V4-Flash's tokenizer: the tiny character tokenizer plus the release's special tokens
    as added tokens, no chat template (the release ships none)."""
    tokenizer = build_tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [
        BOS, "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"]})
    return tokenizer


def test_auto_is_deepseek_v4_for_its_tokenizer_and_an_error_for_the_tiny_one():
    assert resolved_encoding(dsv4_stand_in(), "auto") == "deepseek_v4"
    tiny = build_tiny_tokenizer()
    assert resolved_encoding(tiny, "none") == "none"
    with pytest.raises(RecipeError, match="data.chat_encoding: auto needs .* has neither"):
        resolved_encoding(tiny, "auto")
    with pytest.raises(RecipeError, match="data.chat_encoding: deepseek_v4, but the tokenizer"):
        resolved_encoding(tiny, "deepseek_v4")
    with pytest.raises(RecipeError, match="data.chat_encoding: chat_template, but the tokenizer"):
        resolved_encoding(tiny, "chat_template")


def test_ids_are_the_encoded_text_without_added_tokens(tmp_path):
    """BOS and the turn markers come from the text, once each, as single ids (LumenRL tokenizes with
    add_special_tokens=False); the tiny recipe's none is BOS + the text."""
    tokenizer = dsv4_stand_in()
    (problem,) = load_rows(tmp_path, [{"data_source": "t", "prompt": [{"role": "user", "content": "12+3="}],
                                       "reward_model": {"ground_truth": "15"}}])
    (ids,) = all_prompt_ids(tokenizer, [problem], "stored", "auto")
    special = tokenizer.convert_tokens_to_ids([BOS, "<｜User｜>", "<｜Assistant｜>", "<think>"])
    assert ids == [special[0], special[1], *tokenizer("12+3=", add_special_tokens=False).input_ids,
                   special[2], special[3]]
    tiny = build_tiny_tokenizer()
    assert all_prompt_ids(tiny, [problem], "stored", "none") == [tiny("12+3=").input_ids]
    assert tiny("12+3=").input_ids[0] == tiny.bos_token_id
