"""DeepSeek-V4's prompt encoding (thinking mode) for the chat turns a math dataset carries: system, user, assistant.

DeepSeek-V4's release ships no Jinja chat template: its tokenizer has no ``chat_template``, and the encoding is a
Python module (vLLM carries it as ``vllm.tokenizers.deepseek_v4_encoding``). LumenRL renders every DeepSeek-V4
prompt with that module's ``encode_messages(messages, thinking_mode="thinking")`` when the tokenizer has no template
and knows the ``<｜User｜>``/``<｜Assistant｜>`` tokens (lumenrl/trainer/rl_trainer.py ``_format_chat_prompt``,
lines 65-85 at 2232f55), then tokenizes the text without adding special tokens (lines 614-620).

Why repro writes it out instead of importing vLLM's: the prompts are made on the driver, which on a CPU machine and
in repro's own loop has no vLLM (and importing vLLM starts its platform detection for a string format), and the
rule for these three roles is a dozen lines. What it produces, for messages m_0..m_n with no tools:

    <｜begin▁of▁sentence｜>                       once, at the start
    system     -> its content, as is              (no turn marker)
    user       -> <｜User｜> + content; consecutive user turns are one turn, their contents joined by a blank line
    assistant  -> [reasoning + </think> only after the last user turn] + content + <｜end▁of▁sentence｜>
    after a user turn that is last or followed by an assistant turn: <｜Assistant｜> then <think> if it is the last
    user turn, else </think>

Anything else the encoder knows -- tools, tool calls, tool results, developer/latest_reminder roles, task tokens,
``wo_eos``, reasoning effort -- is refused with an error naming the message and key, never rendered differently.
Checked against vLLM 0.25.1's encoder through LumenRL's own ``_extract_prompt_gt`` (tests/test_chat_encoding.py,
on renderings recorded by benchmarks/lumenrl_prompt_equivalence.py).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from repro.errors import DataError

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK_START, THINK_END = "<think>", "</think>"
TURN_TOKENS = (USER, ASSISTANT)  # the tokens LumenRL looks for before choosing this encoder
ROLES = ("system", "user", "assistant")
KNOWN_KEYS = {"role", "content", "reasoning"}


def _checked(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    out = []
    for index, message in enumerate(messages):
        role = message.get("role")
        if role not in ROLES:
            raise DataError(f"message {index}: role {role!r} is not encoded here (only {', '.join(ROLES)})")
        extra = sorted(k for k, v in message.items() if k not in KNOWN_KEYS and v not in (None, False, "", [], {}))
        if extra:
            raise DataError(f"message {index} ({role}): key {extra[0]!r} is not encoded here (tools, tool calls, "
                            "tasks and the like are DeepSeek-V4 features a math prompt does not use)")
        for key in ("content", "reasoning"):
            if message.get(key) is not None and not isinstance(message[key], str):
                raise DataError(f"message {index} ({role}): {key} must be a string, got {type(message[key]).__name__}")
        out.append({"role": role, "content": message.get("content") or "", "reasoning": message.get("reasoning") or ""})
    return out


def _merged_user_turns(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """Consecutive user turns become one, their texts joined by a blank line (the encoder's tool-message merge)."""
    merged: list[dict[str, str]] = []
    for message in messages:
        if message["role"] == "user" and merged and merged[-1]["role"] == "user":
            merged[-1] = {**merged[-1], "content": merged[-1]["content"] + "\n\n" + message["content"]}
        else:
            merged.append(dict(message))
    return merged


def encode_deepseek_v4(messages: Sequence[Mapping[str, Any]]) -> str:
    """The prompt text DeepSeek-V4's ``encode_messages(messages, thinking_mode="thinking")`` makes (module
    docstring), BOS included; tokenize it without adding special tokens."""
    turns = _merged_user_turns(_checked(messages))
    last_user = max((i for i, m in enumerate(turns) if m["role"] == "user"), default=-1)
    parts = [BOS]
    for index, message in enumerate(turns):
        role = message["role"]
        if role == "system":
            parts.append(message["content"])
        elif role == "user":
            parts.append(USER + message["content"])
        else:
            thinking = message["reasoning"] + THINK_END if index > last_user else ""
            parts.append(thinking + message["content"] + EOS)
        following = turns[index + 1]["role"] if index + 1 < len(turns) else None
        if role == "user" and following in (None, "assistant"):
            parts.append(ASSISTANT + (THINK_START if index >= last_user else THINK_END))
    return "".join(parts)
