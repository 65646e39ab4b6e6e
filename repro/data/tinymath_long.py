"""tiny-math-long: tiny-math with worked answers a few hundred tokens long, for the length effects of mismatch.

The short task's responses are 12 tokens, so nothing that grows with position (an FP8 KV cache read back many
times, the compressed attention's indexer choosing among more entries than it keeps, routing flips that
compound) can show. Here the response shows its working: a running total, one line per term, then the DAPO
``Answer:`` line, so the same reward rule scores it::

    prompt   "37+4 05="            start 37, add 4, five times
    response "04:37+4=41\\n03:41+4=45\\n02:45+4=49\\n01:49+4=53\\n00:53+4=57\\nAnswer: 57"

Why this shape: every line depends only on the line before it (the counter counts down, the step is copied,
the total is the last line's), so a ~2M-parameter model whose sliding window is 64 tokens can learn it, and
the only way to get the answer right is to get every line right: the reward sees the whole response. The
counter says when to stop without looking back at the prompt. ``terms`` is the length knob: about 12 tokens
per term (``terms`` 12 gives ~150-token responses, 20 gives ~250). The prompt uses only the short task's
characters, so the tokenizer and the model's vocabulary are the same.

The held-out set (30 fixed problems, never trained on) comes from the same distribution: the working, not the
operands, is what makes a problem hard here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

DATA_SOURCE = "tiny-math-long"
LONG_HELD_OUT_SIZE = 30
LONG_HELD_OUT_SEED = 2025  # fixed: the held-out set must not change with the run seed
MIN_TERMS, MAX_TERMS = 1, 99  # the counter is two digits
FILE_PREFIX = "long_"  # long_train.parquet beside the short task's train.parquet: never one file for both


@dataclass(frozen=True)
class RunningTotal:
    """Start at ``start`` (10-99), add ``step`` (1-9) ``terms`` times; the response shows every partial sum."""

    start: int
    step: int
    terms: int

    @property
    def problem(self) -> str:
        return f"{self.start:02d}+{self.step} {self.terms:02d}"

    @property
    def answer(self) -> str:
        return str(self.start + self.step * self.terms)

    @property
    def working(self) -> str:
        """The worked lines, each ``<terms left>:<total>+<step>=<new total>``, newline-terminated."""
        lines, total = [], self.start
        for left in range(self.terms - 1, -1, -1):
            lines.append(f"{left:02d}:{total}+{self.step}={total + self.step}\n")
            total += self.step
        return "".join(lines)

    @property
    def response(self) -> str:
        """The whole target response: the working, then the ``Answer:`` line (EOS is the tokenizer's)."""
        return f"{self.working}Answer: {self.answer}"


def check_terms(terms: int) -> int:
    if not MIN_TERMS <= terms <= MAX_TERMS:
        raise ValueError(f"terms must be in [{MIN_TERMS}, {MAX_TERMS}] (a two-digit counter), got {terms}")
    return terms


def all_long_problems(terms: int) -> list[RunningTotal]:
    """Every problem at ``terms``: 90 starts x 9 steps = 810, in a fixed order."""
    check_terms(terms)
    return [RunningTotal(start, step, terms) for start in range(10, 100) for step in range(1, 10)]


def long_held_out_problems(terms: int, n: int = LONG_HELD_OUT_SIZE) -> list[RunningTotal]:
    """The fixed held-out set: ``n`` problems drawn with a fixed seed, the same for every run."""
    return random.Random(LONG_HELD_OUT_SEED).sample(all_long_problems(terms), n)


def long_train_problems(terms: int, seed: int = 0, n: int | None = None) -> list[RunningTotal]:
    """Training problems in a seeded shuffled order, never a held-out one."""
    held = set(long_held_out_problems(terms))
    pool = [p for p in all_long_problems(terms) if p not in held]
    random.Random(seed).shuffle(pool)
    return pool if n is None else pool[:n]


def to_long_dapo_row(problem: RunningTotal, index: int, split: str) -> dict:
    """A row in verl's DAPO-Math-17K layout (the tiny task's prompt template: ``problem=``)."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{problem.problem}="}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": problem.answer},
        "extra_info": {"index": index, "split": split, "start": problem.start, "step": problem.step,
                       "terms": problem.terms},
    }


def write_tiny_math_long(out_dir: str | Path, terms: int, seed: int = 0,
                         splits: tuple[str, ...] = ("train", "held_out")) -> dict[str, Path]:
    """Write ``long_<split>.parquet`` for each of ``splits`` into ``out_dir`` (temp file, then rename)."""
    import pandas as pd

    makers = {"train": lambda: long_train_problems(terms, seed), "held_out": lambda: long_held_out_problems(terms)}
    unknown = set(splits) - set(makers)
    if unknown:
        raise ValueError(f"write_tiny_math_long: unknown split(s) {sorted(unknown)}; the task has {sorted(makers)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split in splits:
        frame = pd.DataFrame([to_long_dapo_row(p, i, split) for i, p in enumerate(makers[split]())])
        final = out / f"{FILE_PREFIX}{split}.parquet"
        tmp = final.with_suffix(".parquet.tmp")
        frame.to_parquet(tmp, index=False)
        tmp.replace(final)
        paths[split] = final
    return paths
