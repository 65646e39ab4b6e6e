"""Throughput of the DAPO math reward on realistic responses.

Usage: python benchmarks/bench_reward.py [--n 10000] [--seed 0] [--repeats 3]

Responses are 1-4 KB of step-by-step reasoning in the shape the DAPO prompt asks for (LaTeX, a boxed
result, a final "Answer:" line); a third are wrong, a tenth have no Answer line at all, so every branch of
the rule is exercised. Prints responses/s (best of --repeats) and the accuracy, which must be 0.6.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from repro.reward import accuracy, score_batch

REASONING_LINES = (
    "Let $x$ be the number of integers with $x^2 \\equiv {a} \\pmod{{{b}}}$.",
    "By the Chinese remainder theorem, we combine the residues modulo {a} and {b}.",
    "Substituting, we get $\\frac{{{a}}}{{{b}}} + \\sqrt{{{a}}} = {c}$, which simplifies nicely.",
    "So the sum over all cases is ${a} + {b} = {c}$.",
    "Checking the boundary case $n = {a}$ gives no new solutions.",
    "Hence the area of the triangle is $\\tfrac12 \\cdot {a} \\cdot {b} = {c}$ square units.",
)


def realistic_response(rng: random.Random, answer: str, kind: str) -> str:
    target_chars = rng.randint(1024, 4096)
    lines: list[str] = []
    while sum(len(line) + 1 for line in lines) < target_chars:
        a, b = rng.randint(2, 999), rng.randint(2, 999)
        lines.append(rng.choice(REASONING_LINES).format(a=a, b=b, c=a + b))
    if kind == "no_answer_line":
        return "\n".join(lines)
    final = answer if kind == "correct" else str(int(answer) + rng.randint(1, 9))
    closing = rng.choice((f"Answer: {final}", f"Answer: $\\boxed{{{final}}}$", f"Answer: {int(final):,}"))
    return "\n".join(lines) + f"\nThus the answer is $\\boxed{{{final}}}$.\n\n{closing}"


def build_batch(n: int, seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    kinds = ["correct"] * 6 + ["wrong"] * 3 + ["no_answer_line"]
    responses, truths = [], []
    for index in range(n):
        answer = str(rng.randint(0, 99_999))
        responses.append(realistic_response(rng, answer, kinds[index % len(kinds)]))
        truths.append(answer)
    return responses, truths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    responses, truths = build_batch(args.n, args.seed)
    mean_kb = sum(len(r) for r in responses) / len(responses) / 1024
    best = float("inf")
    for _ in range(args.repeats):
        started = time.perf_counter()
        results = score_batch(responses, truths)
        best = min(best, time.perf_counter() - started)
    print(f"responses: {args.n} (mean {mean_kb:.2f} KB), best of {args.repeats}: {best:.3f} s")
    print(f"throughput: {args.n / best:,.0f} responses/s")
    print(f"accuracy: {accuracy(results):.3f} (expected 0.600)")


if __name__ == "__main__":
    main()
