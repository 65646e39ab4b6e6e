"""The recipe's datasets as problems, and problems as prompt token ids.

The tiny task goes through the same loader as DAPO-Math-17K: it is written to parquet in the DAPO layout
first, so one code path reads both scales. A prompt is made as LumenRL makes it (rl_trainer.py at 2232f55):
the row's messages (``data.<split>.template``), LumenRL's answer-format line on held-out prompts
(``eval.answer_format``), then the messages as text (``data.chat_encoding``: the chat template, or DeepSeek-V4's
encoder, ``repro.data.chat_encoding``), tokenized without added special tokens. ``chat_encoding: none`` (the tiny
model) is BOS + the user turn's text.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from repro.recipes.schema import DatasetConfig
from repro.data.chat_encoding import TURN_TOKENS, encode_deepseek_v4
from repro.data.loaders import load_aime2024, load_dapo_math, load_problems
from repro.data.records import DAPO_PROMPT_TEMPLATE, MathProblem, render_messages, with_answer_format
from repro.data.tinymath import TINY_PROMPT_TEMPLATE, write_tiny_math
from repro.data.tinymath_long import write_tiny_math_long
from repro.errors import RecipeError

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe

# template name -> the template a record's last user turn is re-rendered with (None: the messages as stored)
TEMPLATES = {"stored": None, "dapo": DAPO_PROMPT_TEMPLATE, "tiny": TINY_PROMPT_TEMPLATE}
# the templates stripped from stored prompts to find the bare problem (dedupe keys, what reports show)
STRIPPED = {"stored": DAPO_PROMPT_TEMPLATE, "dapo": DAPO_PROMPT_TEMPLATE, "tiny": TINY_PROMPT_TEMPLATE}


def load_dataset(config: DatasetConfig, data_dir: str | Path, seed: int = 0) -> list[MathProblem]:
    """Problems of one recipe dataset. tiny_math_* kinds are generated into ``data_dir`` first."""
    options = dict(on_malformed=config.on_malformed, dedupe=config.dedupe, templates=(STRIPPED[config.template],))
    if config.kind.startswith("tiny_math_long"):
        split = "train" if config.kind == "tiny_math_long_train" else "held_out"
        paths = write_tiny_math_long(data_dir, terms=config.terms, seed=seed, splits=(split,))
        return list(load_problems(paths[split], layout="dapo", **options).problems)
    if config.kind.startswith("tiny_math"):
        split = "train" if config.kind == "tiny_math_train" else "held_out"
        paths = write_tiny_math(data_dir, digits=config.digits, seed=seed, splits=(split,))
        return list(load_problems(paths[split], layout="dapo", **options).problems)
    loader = load_dapo_math if config.kind == "dapo_math" else load_aime2024
    return list(loader(config.path, **options).problems)


def prompt_messages(problem: MathProblem, template_name: str, answer_format: bool = False) -> list[dict[str, str]]:
    """The prompt's chat messages: ``template_name``'s rendering, with LumenRL's answer-format line if asked."""
    messages = render_messages(problem, TEMPLATES[template_name])
    return with_answer_format(messages) if answer_format else messages


def knows_turn_tokens(tokenizer) -> bool:
    """Whether the tokenizer has DeepSeek-V4's ``<｜User｜>``/``<｜Assistant｜>`` as tokens of their own (LumenRL asks
    ``convert_tokens_to_ids`` for them; an unknown token mapped to the unknown id does not count here)."""
    unknown = getattr(tokenizer, "unk_token_id", None)
    ids = [tokenizer.convert_tokens_to_ids(token) for token in TURN_TOKENS]
    return all(i is not None and i != unknown for i in ids)


def resolved_encoding(tokenizer, chat_encoding: str) -> Literal["deepseek_v4", "chat_template", "none"]:
    """``data.chat_encoding`` for this tokenizer: ``auto`` is LumenRL's ``_format_chat_prompt`` choice (rl_trainer.py
    65-85); a tokenizer that cannot do what the recipe asks is an error naming the field."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    if chat_encoding == "auto":
        if has_template:
            return "chat_template"
        if knows_turn_tokens(tokenizer):
            return "deepseek_v4"
        raise RecipeError(f"data.chat_encoding: auto needs a tokenizer with a chat template or DeepSeek-V4's "
                          f"{'/'.join(TURN_TOKENS)} tokens; {name} has neither (set none for BOS + text)")
    if chat_encoding == "chat_template" and not has_template:
        raise RecipeError(f"data.chat_encoding: chat_template, but the tokenizer {name} has no chat template")
    if chat_encoding == "deepseek_v4" and not knows_turn_tokens(tokenizer):
        raise RecipeError(f"data.chat_encoding: deepseek_v4, but the tokenizer {name} lacks {'/'.join(TURN_TOKENS)}")
    return chat_encoding  # type: ignore[return-value]


def prompt_text(tokenizer, messages: list[dict[str, str]], encoding: str) -> str:
    """The text of ``messages`` under a resolved encoding (``resolved_encoding``); ``none``: the last user turn."""
    if encoding == "deepseek_v4":
        return encode_deepseek_v4(messages)
    if encoding == "chat_template":
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return [m for m in messages if m["role"] == "user"][-1]["content"]


def all_prompt_ids(tokenizer, problems: list[MathProblem], template_name: str, chat_encoding: str = "none",
                   answer_format: bool = False) -> list[list[int]]:
    """Token ids of every problem's prompt, the texts tokenized in one batch (a fast tokenizer encodes 15k tiny
    prompts in ~0.8 s so, ~1.2 s one by one): without added special tokens, the text carrying its own (LumenRL's
    token-in path, rl_trainer.py:614-620); ``none``: BOS + the text."""
    if not problems:
        return []
    encoding = resolved_encoding(tokenizer, chat_encoding)
    texts = [prompt_text(tokenizer, prompt_messages(p, template_name, answer_format), encoding) for p in problems]
    if encoding != "none":
        return [list(ids) for ids in tokenizer(texts, add_special_tokens=False).input_ids]
    bos = tokenizer.bos_token_id
    encoded = tokenizer(texts).input_ids
    return [list(ids) if bos is None or (ids and ids[0] == bos) else [bos, *ids] for ids in encoded]


def prompt_ids(tokenizer, problem: MathProblem, template_name: str, chat_encoding: str = "none",
               answer_format: bool = False) -> list[int]:
    """``all_prompt_ids`` of one problem."""
    return all_prompt_ids(tokenizer, [problem], template_name, chat_encoding, answer_format)[0]


def recipe_prompt_ids(tokenizer, problems: list[MathProblem], recipe: "Recipe", split: str) -> list[list[int]]:
    """The prompts of a recipe's ``train`` or ``eval`` problems, as the recipe says to make them."""
    dataset = recipe.data.train if split == "train" else recipe.data.eval
    return all_prompt_ids(tokenizer, problems, dataset.template, recipe.data.chat_encoding,
                          answer_format=split == "eval" and recipe.eval.answer_format)
