"""The DAPO math reward: +1.0 when the last ``Answer:`` line matches the ground truth, else -1.0.

The rule is the one the recipe trains with, verl's ``verl/utils/reward_score/math_dapo.py`` ``compute_score``
(itself the Minerva ``normalize_final_answer`` from lm-evaluation-harness's hendrycks_math task). The facts
it rests on, re-implemented here rather than copied:

* only the last 300 characters of the response are looked at;
* the answer is the capture of the *last* case-insensitive match of ``Answer\\s*:\\s*([^\\n]+)``;
* prediction and ground truth go through the same normalisation (see ``normalize_final_answer``) and are
  compared as strings; nothing is ever evaluated, so model text cannot run code.

One deliberate difference: verl scores a response with no ``Answer:`` line by comparing the string
"[INVALID]" with the ground truth; here such a response is always wrong. verl 0.9.1's ``math_dapo`` then falls back
to the last ``\\boxed{}`` (its strict-box check, without our normalisation: ``\\boxed{ 12 }`` scores -1 there);
ours falls back only with ``boxed_fallback``, by LumenRL's rule (see ``score_response``).

Every step is linear in its input and the response is sliced to 300 characters first, so the cost per
answer is bounded whatever the model emits (1 MB of digits, 10k nested braces, unicode, empty).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Sequence

from repro.errors import ReproError

RESPONSE_TAIL_CHARS = 300  # verl: "The longest answer in MATH-500 has 159 characters"
INVALID_PREDICTION = "[INVALID]"
ANSWER_LINE = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)
BOXED_OPEN = "\\boxed{"

# Minerva rules, applied in this order with plain substring replacement (order matters: "\\$" must be gone
# before spaces are, and "\\text{m}" becomes "\\text{}" before the removals delete "\\text{}").
SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)
REMOVED_EXPRESSIONS: tuple[str, ...] = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
    "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
    "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
    "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;",
    ",\\!", "{,}", '"', "\\dots",
)
UNWRAPPED_MACROS = ("\\text{", "\\textbf{", "\\overline{")  # innermost-first: up to the first "}"
VERIFIERS = ("dapo", "math_verify")


@dataclass(frozen=True, slots=True)
class RewardResult:
    """score is +1.0/-1.0 (what GRPO sees); acc is what accuracy is reported from; pred is normalised."""

    score: float
    acc: bool
    pred: str


def _map_lines(text: str, rewrite_line) -> str:
    # Minerva's patterns use "." without DOTALL, so each of them works within one line.
    if "\n" not in text:
        return rewrite_line(text)
    return "\n".join(rewrite_line(line) for line in text.split("\n"))


def _keep_first_dollar_span(line: str) -> str:
    """``a $x$ b $y$`` -> ``$x$``: the first inline-math span of the line replaces the whole line."""
    first = line.find("$")
    second = line.find("$", first + 1) if first >= 0 else -1
    return line if second < 0 else "$" + line[first + 1 : second] + "$"


def _unwrap_to_first_close(line: str, opener: str) -> str:
    """``\\text{ab}c`` -> ``abc``: each opener loses its own brace and the first "}" after it."""
    pieces, cursor = [], 0
    while (start := line.find(opener, cursor)) >= 0:
        close = line.find("}", start + len(opener))
        if close < 0:  # no "}" left on the line, so no later opener can match either
            break
        pieces.append(line[cursor:start])
        pieces.append(line[start + len(opener) : close])
        cursor = close + 1
    pieces.append(line[cursor:])
    return "".join(pieces)


def _unwrap_boxed_greedy(line: str) -> str:
    """``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``: from the first ``\\boxed{`` to the LAST "}" on the line."""
    start = line.find("\\boxed{")
    close = line.rfind("}")
    if start < 0 or close < start + len("\\boxed{"):
        return line
    return line[:start] + line[start + len("\\boxed{") : close] + line[close + 1 :]


def _expand_shorthand(text: str, name: str, arity: int) -> str:
    """``frac12`` -> ``frac{1}{2}``, ``sqrt2`` -> ``sqrt{2}``: only when no "{" follows the name.

    Minerva's pattern for the frac's second argument is "." (not a newline); the first is "[^{]".
    """
    pieces, cursor, search_from = [], 0, 0
    while (start := text.find(name, search_from)) >= 0:
        args_at = start + len(name)
        args = text[args_at : args_at + arity]
        if len(args) < arity or args[0] == "{" or (arity == 2 and args[1] == "\n"):
            search_from = args_at
            continue
        pieces.append(text[cursor:args_at])
        pieces.append("".join("{" + char + "}" for char in args))
        cursor = search_from = args_at + arity
    pieces.append(text[cursor:])
    return "".join(pieces)


def normalize_final_answer(answer: str) -> str:
    """Minerva normalisation (Lewkowycz et al. 2022, appendix D; verl math_dapo.normalize_final_answer)."""
    answer = answer.split("=")[-1]
    for before, after in SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for expression in REMOVED_EXPRESSIONS:
        answer = answer.replace(expression, "")
    answer = _map_lines(answer, _keep_first_dollar_span)
    for opener in UNWRAPPED_MACROS:
        answer = _map_lines(answer, lambda line, opener=opener: _unwrap_to_first_close(line, opener))
    answer = _map_lines(answer, _unwrap_boxed_greedy)
    answer = _expand_shorthand(answer, "frac", 2)
    answer = _expand_shorthand(answer, "sqrt", 1)
    answer = answer.replace("$", "")
    without_commas = answer.replace(",", "")
    if without_commas.isdigit():  # "1,000" -> "1000"; str.isdigit as in the rule, so unicode digits count
        answer = without_commas
    return answer.strip()


@lru_cache(maxsize=65536)
def _normalized_ground_truth(ground_truth: str) -> str:
    # Cached because GRPO scores every ground truth once per response in its group (8 times here).
    return normalize_final_answer(ground_truth)


def _as_text(value: object, what: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value[-4 * RESPONSE_TAIL_CHARS :].decode("utf-8", errors="replace")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # AIME answers are often stored as integers
    raise ReproError(f"reward: {what} must be a string, got {type(value).__name__}")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text``, its braces balanced, or None (no ``\\boxed{`` or one
    that never closes). The fallback LumenRL's reward added in 2232f55 (``lumenrl/rewards/math_reward.py``)."""
    start = text.rfind(BOXED_OPEN)
    if start < 0:
        return None
    depth = 0
    for index in range(start + len(BOXED_OPEN) - 1, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return text[start + len(BOXED_OPEN):index]
    return None


def extract_answer(response: object, boxed_fallback: bool = False) -> str | None:
    """The raw text after the last ``Answer:`` in the response's last 300 characters; without one, with
    ``boxed_fallback``, the content of the last ``\\boxed{...}`` there; else None."""
    tail = _as_text(response, "response")[-RESPONSE_TAIL_CHARS:]
    last = None
    for last in ANSWER_LINE.finditer(tail):
        pass
    if last is not None:
        return last.group(1)
    return last_boxed(tail) if boxed_fallback else None


def _math_verify_agrees(raw_answer: str, ground_truth: str) -> bool:
    try:
        import math_verify  # optional: heavy (sympy + antlr) and not a pinned dependency
    except ImportError as missing:
        raise ReproError(
            "reward: verifier='math_verify' needs the math-verify package, which is not installed; "
            "install it with `pip install 'math-verify[antlr4_13_2]'` or use verifier='dapo'"
        ) from missing
    gold = math_verify.parse(ground_truth)
    guess = math_verify.parse(raw_answer)
    return bool(math_verify.verify(gold, guess))


def score_response(response: object, ground_truth: object, verifier: str = "dapo",
                   boxed_fallback: bool = False) -> RewardResult:
    """Score one response against its ground truth with the DAPO rule (or math-verify, opt-in). With
    ``boxed_fallback`` a response without an ``Answer:`` line is scored on its last ``\\boxed{...}``, as LumenRL's
    reward does since 2232f55 (the recipe's ``reward.boxed_fallback``; verl 0.9.1's ``math_dapo`` has a fallback of
    its own, by other rules: repro/verl/reward_fn.py).

    ``verifier="math_verify"`` keeps the same bounded ``Answer:`` extraction but replaces the string
    comparison with math-verify's symbolic check (its own LaTeX parser and timeouts, no Python eval), as
    an independent second opinion on evaluation numbers. It is opt-in and never needed for training.
    """
    if verifier not in VERIFIERS:
        raise ReproError(f"reward: unknown verifier {verifier!r}; expected one of {VERIFIERS}")
    truth = _as_text(ground_truth, "ground_truth")
    raw_answer = extract_answer(response, boxed_fallback)
    if raw_answer is None:
        if verifier == "math_verify":
            _math_verify_agrees("", truth)  # surface the missing-package error whatever the response
        return RewardResult(score=-1.0, acc=False, pred=INVALID_PREDICTION)
    pred = normalize_final_answer(raw_answer)
    if verifier == "math_verify":
        correct = _math_verify_agrees(raw_answer, truth)
    else:
        correct = pred == _normalized_ground_truth(truth)
    return RewardResult(score=1.0 if correct else -1.0, acc=correct, pred=pred)


def score_batch(
    responses: Sequence[object], ground_truths: Sequence[object], verifier: str = "dapo"
) -> list[RewardResult]:
    """Score responses[i] against ground_truths[i]; the two lists must be the same length."""
    if len(responses) != len(ground_truths):
        raise ReproError(
            f"reward: {len(responses)} responses but {len(ground_truths)} ground truths; they pair up 1:1"
        )
    return [score_response(r, g, verifier) for r, g in zip(responses, ground_truths)]


def accuracy(results: Iterable[RewardResult]) -> float:
    """Fraction with acc=True. Report this, not mean_score: the two differ (mean_score = 2*acc - 1)."""
    results = list(results)
    if not results:
        raise ReproError("reward: accuracy of an empty list of results is undefined")
    return sum(result.acc for result in results) / len(results)


def mean_score(results: Iterable[RewardResult]) -> float:
    """Mean reward in [-1, 1], the quantity GRPO's logs call score/mean."""
    results = list(results)
    if not results:
        raise ReproError("reward: mean score of an empty list of results is undefined")
    return sum(result.score for result in results) / len(results)
