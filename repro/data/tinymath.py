"""tiny-math: a synthetic arithmetic task in the DAPO-Math-17K row layout, sized for a ~2M-parameter model.

Why this shape (measured on this project's CPU, see shared/notes/tiny-learning.md): zero-padded fixed-width
operands make every prompt the same length (no padding in a batch) and a short prompt learns far faster
than a long one. The response keeps the full recipe's ``Answer:`` convention, so the same DAPO reward rule
scores both scales: the model writes ``Answer: 42`` then EOS.

The held-out set stands in for AIME-2024: 30 fixed problems, "harder" because every one needs a carry
(addition) or a borrow (subtraction), and never seen in training. It stays inside the operand range the
warm start sees, because problems outside it (e.g. 3-digit operands) score 0% and measure nothing.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

DATA_SOURCE = "tiny-math"
# Characters the tiny tokenizer must cover: prompts, the `Answer:` convention, and a little slack.
TINY_ALPHABET = "0123456789+-=Answer: \n"
TINY_PROMPT_TEMPLATE = "{problem}="
TINY_RESPONSE_TEMPLATE = "Answer: {answer}"
HELD_OUT_SIZE = 30
HELD_OUT_SEED = 2024  # fixed: the held-out set must not change with the run seed


@dataclass(frozen=True)
class Arithmetic:
    """One problem: ``a op b`` with zero-padded operands of ``digits`` width."""

    a: int
    op: str
    b: int
    digits: int = 2

    @property
    def problem(self) -> str:
        return f"{self.a:0{self.digits}d}{self.op}{self.b:0{self.digits}d}"

    @property
    def answer(self) -> str:
        return str(self.a + self.b if self.op == "+" else self.a - self.b)

    @property
    def response(self) -> str:
        """The target response (EOS is the tokenizer's): the task shows no working."""
        return TINY_RESPONSE_TEMPLATE.format(answer=self.answer)

    @property
    def needs_carry_or_borrow(self) -> bool:
        """True if any column carries (``+``) or borrows (``-``): the harder slice."""
        a, b, carry = self.a, self.b, 0
        for _ in range(self.digits):
            da, db = a % 10, b % 10
            if self.op == "+" and da + db + carry >= 10:
                return True
            if self.op == "-" and da - carry < db:
                return True
            a, b = a // 10, b // 10
        return False


def all_problems(digits: int = 2, ops: tuple[str, ...] = ("+", "-")) -> list[Arithmetic]:
    """Every problem of the task: ``a, b < 10**digits``; subtraction only where ``a >= b`` (no negatives).

    ``digits`` is the difficulty knob: 1 gives 155 problems, 2 gives 15,050, 3 gives 1,500,500.
    """
    if digits < 1 or digits > 3:
        raise ValueError(f"digits must be 1, 2 or 3, got {digits}")
    unknown = set(ops) - {"+", "-"}
    if unknown:
        raise ValueError(f"ops may only contain '+' and '-', got {sorted(unknown)}")
    top = 10**digits
    return [
        Arithmetic(a, op, b, digits)
        for op in ops
        for a in range(top)
        for b in range(top)
        if op == "+" or a >= b
    ]


def held_out_problems(digits: int = 2, n: int = HELD_OUT_SIZE) -> list[Arithmetic]:
    """The fixed held-out set: ``n`` carry/borrow problems, half ``+`` and half ``-``, same for every run."""
    rng = random.Random(HELD_OUT_SEED)
    hard = [p for p in all_problems(digits) if p.needs_carry_or_borrow]
    adds = [p for p in hard if p.op == "+"]
    subs = [p for p in hard if p.op == "-"]
    n_subs = min(n // 2, len(subs))  # 1-digit subtraction never borrows: then all come from addition
    if len(adds) < n - n_subs:
        raise ValueError(f"only {len(adds) + len(subs)} carry/borrow problems at digits={digits}, need {n}")
    return rng.sample(adds, n - n_subs) + rng.sample(subs, n_subs)


def train_problems(digits: int = 2, n: int | None = None, seed: int = 0) -> list[Arithmetic]:
    """Training problems in a seeded shuffled order, never including a held-out problem."""
    held = set(held_out_problems(digits))
    pool = [p for p in all_problems(digits) if p not in held]
    random.Random(seed).shuffle(pool)
    return pool if n is None else pool[:n]


def to_dapo_row(problem: Arithmetic, index: int, split: str) -> dict:
    """A row in verl's DAPO-Math-17K parquet layout, so the real and tiny data share one loader."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": TINY_PROMPT_TEMPLATE.format(problem=problem.problem)}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": problem.answer},
        "extra_info": {"index": index, "split": split, "a": problem.a, "op": problem.op, "b": problem.b},
    }


def write_tiny_math(out_dir: str | Path, digits: int = 2, seed: int = 0,
                    splits: tuple[str, ...] = ("train", "held_out")) -> dict[str, Path]:
    """Write ``<split>.parquet`` for each of ``splits`` (train, held_out) into ``out_dir`` (atomically, via temp
    files)."""
    import pandas as pd

    makers = {"train": lambda: train_problems(digits, seed=seed), "held_out": lambda: held_out_problems(digits)}
    unknown = set(splits) - set(makers)
    if unknown:
        raise ValueError(f"write_tiny_math: unknown split(s) {sorted(unknown)}; the task has {sorted(makers)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split in splits:
        problems = makers[split]()
        frame = pd.DataFrame([to_dapo_row(p, i, split) for i, p in enumerate(problems)])
        final = out / f"{split}.parquet"
        tmp = final.with_suffix(".parquet.tmp")
        frame.to_parquet(tmp, index=False)
        tmp.replace(final)
        paths[split] = final
    return paths
