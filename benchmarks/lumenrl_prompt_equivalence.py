"""Our prompts against LumenRL's own rendering of the same dataset rows (not a timed test: needs a LumenRL checkout
and vLLM's DeepSeek-V4 encoder file; no GPU, no vLLM install).

    python benchmarks/lumenrl_prompt_equivalence.py /path/to/Lumen-RL /path/to/vllm/tokenizers/deepseek_v4_encoding.py
        [--record tests/data/lumenrl/prompt_renderings.json]

LumenRL (dev/dsv4-grpo, 2232f55) makes a prompt in ``RLTrainer._extract_prompt_gt`` and ``_format_chat_prompt``
(lumenrl/trainer/rl_trainer.py): both are taken from the file's text and run alone, so the trainer's heavy imports
are not needed; ``_format_chat_prompt`` imports ``vllm.tokenizers.deepseek_v4_encoding``, which is loaded from the
given file (vLLM 0.25.1's, AMD's image, is the one recorded: it needs only ``regex``). The tokenizer is a stand-in
for DeepSeek-V4-Flash's as LumenRL's own test models it (tests/unit/test_rl_trainer_alignment.py:178-227): no chat
template, ids for the two turn tokens. Each row is rendered as training does (``ensure_answer_format=False``) or as
evaluation does (``True``); repro loads the same rows from a JSONL file with its own loader and renders them as the
AMD recipe says (``data.*.template: stored``, ``data.chat_encoding: deepseek_v4``, ``eval.answer_format``). Then
``--fuzz`` random conversations of system/user/assistant turns (reasoning on some assistant turns) go through vLLM's
``encode_messages(thinking_mode="thinking")`` and ``repro.data.chat_encoding.encode_deepseek_v4``. Prints each case
and the fuzz count; exit status 1 if a text differs. ``--record`` writes LumenRL's texts for
tests/test_chat_encoding.py.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import logging
import random
import sys
import tempfile
import textwrap
import types
from pathlib import Path
from typing import Any

import torch

from repro.data.chat_encoding import encode_deepseek_v4
from repro.data.loaders import load_problems
from repro.data.recipe_datasets import prompt_messages, prompt_text
from repro.data.sampler import PromptSampler

DAPO_INSTRUCTION = ("Solve the following math problem step by step. The last line of your response should be of the "
                    "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
DAPO_REMINDER = '\n\nRemember to put your answer on its own line after "Answer:".'
AIME_2024_I_2 = (r"There exist real numbers $x$ and $y$, both greater than 1, such that "
                 r"$\log_x\left(y^x\right)=\log_y\left(x^{4y}\right)=10$. Find $xy$.")


def row(messages: list[dict[str, str]], answer: str, source: str, index: int) -> dict[str, Any]:
    return {"data_source": source, "prompt": messages, "ability": "MATH",
            "reward_model": {"ground_truth": answer, "style": "rule"}, "extra_info": {"index": index}}


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


# (name, split, row): train rows as DAPO-Math-17K stores them, held-out rows in the layouts an AIME-2024 file has
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("dapo_math_row", "train", row([user(DAPO_INSTRUCTION + "Let $x$ and $y$ be real numbers such that $x+y=10$ and "
                                          "$xy=21$. Find $x^2+y^2$." + DAPO_REMINDER)], "58", "math_dapo", 0)),
    ("aime_row_bare_problem", "eval", row([user(AIME_2024_I_2)], "25", "aime2024", 1)),
    ("aime_row_dapo_layout", "eval",
     row([user(DAPO_INSTRUCTION + AIME_2024_I_2 + DAPO_REMINDER)], "25", "aime2024", 2)),
    ("system_and_user", "train", row([{"role": "system", "content": "You are a careful mathematician."},
                                      user("What is $2^{10}$?")], "1024", "edge", 3)),
    ("two_user_turns", "eval", row([user("First, a warm-up."), user("Now: what is $7 \\cdot 6$?")], "42", "edge", 4)),
    ("earlier_exchange", "eval", row([user("What is 1+1?"), {"role": "assistant", "content": "Answer: 2"},
                                      user("And 2+2?")], "4", "edge", 5)),
]


def load_vllm_encoder(path: Path) -> str:
    """Register the encoder file as ``vllm.tokenizers.deepseek_v4_encoding``; returns its sha256."""
    spec = importlib.util.spec_from_file_location("vllm.tokenizers.deepseek_v4_encoding", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    vllm, tokenizers = types.ModuleType("vllm"), types.ModuleType("vllm.tokenizers")
    vllm.tokenizers, tokenizers.deepseek_v4_encoding = tokenizers, module
    sys.modules.update({"vllm": vllm, "vllm.tokenizers": tokenizers, "vllm.tokenizers.deepseek_v4_encoding": module})
    return hashlib.sha256(path.read_bytes()).hexdigest()


def lumenrl_functions(checkout: Path) -> dict[str, Any]:
    """LumenRL's ``_format_chat_prompt`` and the trainer methods that make prompts and their order
    (``_extract_prompt_gt``, ``_build_prompt_permutation``, ``_get_prompts_range``), to run on a stand-in trainer."""
    source = (checkout / "lumenrl/trainer/rl_trainer.py").read_text()
    start = source.index("def _format_chat_prompt(")
    namespace: dict[str, Any] = {"Any": Any, "torch": torch, "logger": logging.getLogger("lumenrl")}
    exec(source[start:source.index("\nclass ", start)], namespace)  # LumenRL's own code, trusted
    for name in ("_extract_prompt_gt", "_build_prompt_permutation", "_get_prompts_range"):
        method = source.index(f"    def {name}(")
        exec(textwrap.dedent(source[method:source.index("\n    def ", method + 10)]), namespace)
    return namespace


class NumberedRows:
    """A dataset of ``rows`` rows made on access (1.79M dicts would not fit): row i's ground truth is i."""

    def __init__(self, rows: int):
        self.rows = rows

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: int) -> dict[str, Any]:
        return row([user(f"row {index}")], str(index), "order", index)


def lumenrl_order(functions: dict[str, Any], rows: int, seed: int, batch: int, steps: int) -> list[list[int]]:
    """The row indices of LumenRL's first ``steps`` batches over a ``rows``-row file (each row's ground truth is its
    index), through its own permutation and cursor (``_collect_rollout_batch`` advances the cursor by ``batch``)."""
    trainer_class = type("Trainer", (), {name: functions[name] for name in
                                          ("_extract_prompt_gt", "_build_prompt_permutation", "_get_prompts_range")})
    trainer = trainer_class()
    trainer._tokenizer = DeepSeekV4TokenizerStandIn()
    trainer._dataset = NumberedRows(rows)
    trainer.config = types.SimpleNamespace(reward=types.SimpleNamespace(shuffle=True, shuffle_seed=seed), seed=seed)
    trainer._build_prompt_permutation()
    batches = []
    for step in range(steps):
        _, truths = trainer._get_prompts_range(step * batch, batch)
        batches.append([int(t) for t in truths])
    return batches


def repro_order(rows: int, seed: int, batch: int, steps: int) -> list[list[int]]:
    sampler = PromptSampler(rows, batch, seed, order="randperm")
    return [sampler.next_batch() for _ in range(steps)]


# (rows, seed, prompts per step, steps): DAPO-Math-17K's 1,791,700 rows and its 17,398 distinct problems; 50 wraps
ORDER_CASES = [(1_791_700, 10086, 32, 3), (17_398, 10086, 32, 3), (50, 10086, 32, 5)]


class DeepSeekV4TokenizerStandIn:
    """What LumenRL asks of DeepSeek-V4-Flash's tokenizer: no chat template, ids for the turn tokens."""

    chat_template = None

    @staticmethod
    def convert_tokens_to_ids(token: str):
        return {"<｜User｜>": 128803, "<｜Assistant｜>": 128804}.get(token)


def repro_prompts(rows: list[dict[str, Any]], answer_format: bool) -> list[str]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "rows.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        problems = load_problems(path, layout="auto", on_malformed="fail", dedupe=False).problems
    return [prompt_text(None, prompt_messages(p, "stored", answer_format), "deepseek_v4") for p in problems]


def fuzz(count: int, seed: int = 0) -> int:
    """How many of ``count`` random conversations vLLM's encoder and ours render differently."""
    from vllm.tokenizers.deepseek_v4_encoding import encode_messages

    rng = random.Random(seed)
    words = ["x", "$\\frac{1}{2}$", "Answer: 3", "\n", "<think>", " ", "", "Solve", "\n\n", "é"]
    differ = 0
    for _ in range(count):
        messages = []
        for _ in range(rng.randint(1, 6)):
            role = rng.choice(["system", "user", "user", "assistant"])
            message = {"role": role, "content": "".join(rng.choice(words) for _ in range(rng.randint(0, 4)))}
            if role == "assistant" and rng.random() < 0.5:
                message["reasoning"] = "".join(rng.choice(words) for _ in range(rng.randint(1, 3)))
            messages.append(message)
        differ += encode_messages(messages, thinking_mode="thinking") != encode_deepseek_v4(messages)
    return differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", type=Path)
    parser.add_argument("encoder", type=Path, help="vllm/tokenizers/deepseek_v4_encoding.py")
    parser.add_argument("--record", type=Path)
    parser.add_argument("--fuzz", type=int, default=20000, help="random conversations to compare (default 20000)")
    args = parser.parse_args()
    digest = load_vllm_encoder(args.encoder)
    functions = lumenrl_functions(args.checkout)
    extract = functions["_extract_prompt_gt"]
    trainer = types.SimpleNamespace(_tokenizer=DeepSeekV4TokenizerStandIn())
    recorded, differ = [], 0
    for name, split, data in CASES:
        theirs, answer = extract(trainer, data, ensure_answer_format=split == "eval")
        (ours,) = repro_prompts([data], answer_format=split == "eval")
        differ += theirs != ours
        verdict = "same" if theirs == ours else "DIFFERS"
        print(f"{name} ({split}): {verdict}\n  LumenRL: {theirs!r}\n  repro:   {ours!r}")
        recorded.append({"name": name, "split": split, "row": data, "lumenrl_prompt": theirs,
                         "lumenrl_ground_truth": answer})
    orders = []
    for rows, seed, batch, steps in ORDER_CASES:
        theirs_order = lumenrl_order(functions, rows, seed, batch, steps)
        same = theirs_order == repro_order(rows, seed, batch, steps)
        differ += not same
        print(f"prompt order over {rows} rows, seed {seed}, {steps} steps of {batch}: {'same' if same else 'DIFFERS'}; "
              f"LumenRL's first step: {theirs_order[0][:8]}...")
        orders.append({"rows": rows, "seed": seed, "batch": batch, "lumenrl_batches": theirs_order})
    if args.record:
        tmp = args.record.with_name(args.record.name + ".tmp")
        tmp.write_text(json.dumps({
            "what": "LumenRL's prompt text for each row (RLTrainer._extract_prompt_gt, ensure_answer_format for "
                    "split eval), written by benchmarks/lumenrl_prompt_equivalence.py",
            "lumenrl": "ZhangDanyang-AMD/Lumen-RL dev/dsv4-grpo 2232f55, lumenrl/trainer/rl_trainer.py",
            "encoder": f"vLLM 0.25.1 vllm/tokenizers/deepseek_v4_encoding.py, sha256 {digest}",
            "torch": torch.__version__, "cases": recorded, "orders": orders}, indent=1, ensure_ascii=False) + "\n")
        tmp.replace(args.record)
        print(f"recorded {len(recorded)} renderings in {args.record}")
    fuzzed = fuzz(args.fuzz)
    print(f"{args.fuzz} random conversations: {fuzzed} rendered differently")
    if differ or fuzzed:
        raise SystemExit(f"{differ} of {len(CASES) + len(ORDER_CASES)} prompts or orders and {fuzzed} of "
                         f"{args.fuzz} conversations differ")


if __name__ == "__main__":
    main()
