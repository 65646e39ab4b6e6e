"""The record every loader returns, and how a record becomes the text the model is prompted with.

DAPO-Math-17K (BytedTsinghua-SIA) ships its prompts with the DAPO template already applied inside
``prompt[0].content``; AIME-2024 ships either that layout or a bare ``problem``. Records therefore keep the
*bare* problem (template stripped) so one rendering step serves every source, plus the messages as stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from repro.errors import RecipeError

PROBLEM_PLACEHOLDER = "{problem}"

# The full recipe's prompt, verbatim as DAPO-Math-17K and its AIME-2024 companion carry it (the format the
# DAPO reward's "Answer:" extraction expects; see repro/reward.py).
DAPO_PROMPT_TEMPLATE = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
    "{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)
RAW_PROMPT_TEMPLATE = PROBLEM_PLACEHOLDER  # the problem as is, for data whose prompts are bare
# What LumenRL's evaluation appends to the last user turn when it has no "Answer:" (rl_trainer.py:1499-1516 at
# 2232f55, ``_extract_prompt_gt(..., ensure_answer_format=True)``), so the reward's "Answer:" rule can score it.
ANSWER_FORMAT_MARKER = "Answer:"
ANSWER_FORMAT_SUFFIX = "\n\nPut the final answer on its own line as: Answer: \\boxed{answer}."


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class MathProblem:
    """One problem, whatever file layout it came from.

    ``problem`` is the bare problem text (any known template removed); ``prompt_messages`` are the chat
    messages exactly as stored (empty for the bare ``problem``/``answer`` layout). ``extra_info`` is a
    read-only view and takes no part in equality, so two loads of the same row compare equal.
    """

    uid: str
    problem: str
    ground_truth: str
    data_source: str
    prompt_messages: tuple[ChatMessage, ...] = ()
    extra_info: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra_info", MappingProxyType(dict(self.extra_info)))


def split_template(template: str) -> tuple[str, str]:
    """(text before, text after) the single ``{problem}`` placeholder of a prompt template."""
    if template.count(PROBLEM_PLACEHOLDER) != 1:
        raise RecipeError(
            f"prompt template must contain {PROBLEM_PLACEHOLDER} exactly once, "
            f"found {template.count(PROBLEM_PLACEHOLDER)} times in {template[:80]!r}"
        )
    before, after = template.split(PROBLEM_PLACEHOLDER)
    return before, after


def strip_template(content: str, templates: Sequence[str] = (DAPO_PROMPT_TEMPLATE,)) -> tuple[str, bool]:
    """The bare problem inside ``content`` and whether one of ``templates`` was found around it.

    The first template whose fixed text both starts and ends ``content`` wins; otherwise ``content`` is
    taken to be bare already (it is returned stripped of surrounding whitespace either way).
    """
    for template in templates:
        before, after = split_template(template)
        if (before or after) and len(content) >= len(before) + len(after):
            if content.startswith(before) and content.endswith(after):
                return content[len(before) : len(content) - len(after)].strip(), True
    return content.strip(), False


def render_prompt(problem: MathProblem, template: str = DAPO_PROMPT_TEMPLATE) -> str:
    """The user turn's text: ``template`` with the bare problem in place of ``{problem}``.

    Plain replacement, not ``str.format``: LaTeX problems are full of braces.
    """
    before, after = split_template(template)
    return before + problem.problem + after


def render_messages(problem: MathProblem, template: str | None = DAPO_PROMPT_TEMPLATE) -> list[dict[str, str]]:
    """Chat messages for the tokenizer's chat template: stored ones (e.g. a system turn) are kept, and the
    last user turn is re-rendered from the bare problem so the template is applied exactly once. ``template``
    None: the messages exactly as the row stores them (LumenRL's reading), one user turn of the bare problem for
    a row that stores none."""
    messages = [m.as_dict() for m in problem.prompt_messages]
    if template is None:
        return messages or [{"role": "user", "content": problem.problem}]
    user_turns = [i for i, m in enumerate(messages) if m["role"] == "user"]
    rendered = {"role": "user", "content": render_prompt(problem, template)}
    if not user_turns:
        return messages + [rendered]
    messages[user_turns[-1]] = rendered
    return messages


def with_answer_format(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """LumenRL's evaluation prompt: ``ANSWER_FORMAT_SUFFIX`` appended to the last user turn unless it already holds
    ``Answer:`` (a new list; the messages given are not changed)."""
    out = [dict(m) for m in messages]
    for message in reversed(out):
        if message["role"] == "user":
            if ANSWER_FORMAT_MARKER not in message["content"]:
                message["content"] += ANSWER_FORMAT_SUFFIX
            break
    return out
