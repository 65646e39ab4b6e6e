"""The DAPO math reward (repro/reward.py) against hand-worked cases of verl's math_dapo rule.

Each expected value below was worked out by hand from the rule (last 300 chars, last ``Answer:`` line,
Minerva normalisation, string equality), not by running the implementation.
"""

import random
import sys
import time

import pytest

from repro.errors import ReproError
from repro.reward import (
    INVALID_PREDICTION,
    RewardResult,
    accuracy,
    extract_answer,
    last_boxed,
    mean_score,
    normalize_final_answer,
    score_batch,
    score_response,
)

PADDING_TO_TAIL_START = "swer: 42\n" + "y" * (300 - len("swer: 42\n"))  # tail starts mid-"Answer"
NESTED_10K = "\\boxed{" + "{" * 10_000 + "42" + "}" * 10_000 + "}"

# (id, response, ground truth, expected acc)
CASES = [
    ("plain", "Answer: 42", "42", True),
    ("after-reasoning", "2 * 21 = 42.\nAnswer: 42", "42", True),
    ("lowercase-keyword", "answer: 42", "42", True),
    ("uppercase-space-before-colon", "ANSWER : 42", "42", True),
    ("no-space-after-colon", "Answer:42", "42", True),
    ("final-answer-prefix", "Final Answer: 42", "42", True),
    ("wrong-number", "Answer: 41", "42", False),
    ("last-of-two-lines-counts", "Answer: 5\nwait, recheck.\nAnswer: 7", "7", True),
    ("first-of-two-lines-ignored", "Answer: 5\nwait, recheck.\nAnswer: 7", "5", False),
    ("text-after-answer-line", "Answer: 42\nI hope this helps.", "42", True),
    ("boxed", "Answer: \\boxed{42}", "42", True),
    ("dollars-math", "Answer: $42$", "42", True),
    ("dollars-boxed", "Answer: $\\boxed{42}$", "42", True),
    ("boxed-frac", "Answer: \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", True),
    ("comma-thousands", "Answer: 1,000", "1000", True),
    ("comma-in-ground-truth", "Answer: 1000", "1,000", True),
    ("comma-millions", "Answer: 1,000,000", "1000000", True),
    ("trailing-period-is-wrong", "Answer: 42.", "42", False),
    ("period-after-math-is-fine", "Answer: $42$.", "42", True),
    ("units-degrees", "Answer: 30 degrees", "30", True),
    ("units-circ", "Answer: 30^\\circ", "30", True),
    ("units-braced-circ", "Answer: 30^{\\circ}", "30", True),
    ("units-cm", "Answer: 5 cm", "5", True),
    ("units-text-inches", "Answer: 3 \\text{ inches}", "3", True),
    ("escaped-dollar-sign", "Answer: \\$42", "42", True),
    ("word-dollars", "Answer: 42 dollars", "42", True),
    ("equation-keeps-rhs", "Answer: x = 5", "5", True),
    ("frac-shorthand", "Answer: \\frac12", "\\frac{1}{2}", True),
    ("dfrac-not-normalised", "Answer: \\dfrac{1}{2}", "\\frac{1}{2}", False),
    ("decimal-vs-fraction-strings-differ", "Answer: 0.5", "\\frac{1}{2}", False),
    ("sqrt-shorthand", "Answer: \\sqrt2", "\\sqrt{2}", True),
    ("text-choice", "Answer: \\text{(B)}", "(B)", True),
    ("integer-ground-truth", "Answer: 204", 204, True),
    ("leading-zero-differs", "Answer: 0204", "204", False),
    ("negative", "answer: -5", "-5", True),
    ("unicode-minus-differs", "Answer: \u22125", "-5", False),
    ("fullwidth-digits-differ", "Answer: \uff14\uff12", "42", False),
    ("unicode-symbol-answer", "\u7b54\u6848 Answer: \u03c0", "\u03c0", True),
    ("unicode-only-no-keyword", "\u6700\u7ec8\u7b54\u6848\uff1a42", "42", False),
    ("emoji-appended", "Answer: 42 \u2705", "42", False),
    ("crlf-line-end", "Answer: 42\r\n", "42", True),
    ("newline-after-colon-is-skipped", "Answer:\n42", "42", True),
    ("no-colon", "The answer is 42", "42", False),
    ("sentence-after-keyword", "Answer: The answer is 42", "42", False),
    ("markdown-bold-keyword", "**Answer:** 42", "42", False),
    ("mod-remark", "Answer: 42 (mod 1000)", "42", False),
    ("answer-beyond-300-chars", "Answer: 42\n" + "x" * 400, "42", False),
    ("answer-after-long-reasoning", "x" * 10_000 + "\nAnswer: 42", "42", True),
    ("keyword-cut-at-tail-start", "An" + PADDING_TO_TAIL_START, "42", False),
    ("keyword-exactly-at-tail-start", "zzAnswer: 42\n" + "y" * (300 - len("Answer: 42\n")), "42", True),
    ("1MB-digits-no-keyword", "1" * 1_000_000, "1", False),
    ("1MB-digits-then-answer", "9" * 1_000_000 + "\nAnswer: 42", "42", True),
    ("answer-then-1MB-digits", "Answer: " + "7" * 1_000_000, "7" * 1_000_000, False),
    ("nested-braces-10k-deep", "Answer: " + NESTED_10K, "42", False),
    ("boxed-keeps-inner-braces", "Answer: \\boxed{{{42}}}", "{{42}}", True),
    ("empty-response", "", "42", False),
    ("none-response", None, "42", False),
    ("keyword-with-nothing-after", "Answer:", "42", False),
    ("keyword-with-only-spaces", "Answer:   ", "42", False),
]


@pytest.mark.parametrize("response, ground_truth, expected_acc", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hand_worked_case(response, ground_truth, expected_acc):
    result = score_response(response, ground_truth)
    assert result.acc is expected_acc
    assert result.score == (1.0 if expected_acc else -1.0)


def test_there_are_at_least_40_cases_with_both_outcomes():
    assert len(CASES) >= 40
    assert {c[3] for c in CASES} == {True, False}
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(
    "raw, normalised",
    [
        ("1,000", "1000"),
        ("$\\boxed{42}$.", "42"),
        ("x = \\frac12", "\\frac{1}{2}"),
        ("30^\\circ", "30"),
        ("\\text{(B)}", "(B)"),
        ("1,2,3", "123"),  # the rule's quirk: any all-digit-after-comma-removal string loses its commas
        ("(1,2)", "(1,2)"),
        ("an apple a day", "appleday"),  # the rule's quirk: "an " and "a " are deleted anywhere
        ("", ""),
    ],
)
def test_normalisation_of_single_answers(raw, normalised):
    assert normalize_final_answer(raw) == normalised


def test_prediction_field_is_normalised_or_invalid():
    assert score_response("Answer: $1,000$ dollars", "1000") == RewardResult(score=1.0, acc=True, pred="1000")
    assert score_response("no keyword here", "1000").pred == INVALID_PREDICTION
    assert score_response("Answer:   ", "42").pred == ""
    assert extract_answer("Answer: 1\nAnswer: 2 ") == "2 "
    assert extract_answer("Answer:") is None


def test_missing_answer_is_wrong_even_if_ground_truth_is_the_invalid_marker():
    assert score_response("nothing", INVALID_PREDICTION).acc is False


def test_non_string_response_is_a_repro_error():
    with pytest.raises(ReproError, match="response must be a string, got list"):
        score_response(["Answer: 42"], "42")


def test_batch_accuracy_and_mean_score_differ_as_documented():
    results = score_batch(["Answer: 1", "Answer: 2", "Answer: 3", "Answer: 0"], ["1", "2", "3", "4"])
    assert [r.acc for r in results] == [True, True, True, False]
    assert accuracy(results) == 0.75
    assert mean_score(results) == 0.5  # 2 * 0.75 - 1


def test_batch_rejects_unpaired_lists_and_empty_metrics():
    with pytest.raises(ReproError, match="2 responses but 1 ground truths"):
        score_batch(["Answer: 1", "Answer: 2"], ["1"])
    with pytest.raises(ReproError, match="empty"):
        accuracy([])
    with pytest.raises(ReproError, match="empty"):
        mean_score([])


def test_unknown_verifier_is_rejected():
    with pytest.raises(ReproError, match="unknown verifier 'sympy'"):
        score_response("Answer: 1", "1", verifier="sympy")


def test_math_verify_missing_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # makes `import math_verify` raise ImportError
    for response in ("Answer: 1", "no answer"):
        with pytest.raises(ReproError, match=r"pip install 'math-verify"):
            score_response(response, "1", verifier="math_verify")


def test_adversarial_inputs_take_bounded_time():
    hostile = [
        "{" * 1_000_000,
        "Answer: " + "\\text{" * 200_000,
        "Answer:" + " " * 1_000_000,
        "\\boxed{" * 100_000 + "Answer: " + "frac" * 100,
        "answer:" * 200_000,
    ]
    started = time.perf_counter()
    results = score_batch(hostile, ["42"] * len(hostile))
    elapsed = time.perf_counter() - started
    assert [r.acc for r in results] == [False] * len(hostile)
    assert elapsed < 1.0, f"adversarial inputs took {elapsed:.3f} s"
    # a hostile ground truth is not sliced, so its normalisation must itself be linear
    started = time.perf_counter()
    assert normalize_final_answer("\\text{" * 200_000) == "\\text{" * 200_000
    assert time.perf_counter() - started < 1.0


def _realistic_response(rng: random.Random, answer: int, correct: bool) -> str:
    steps = [f"Step {i}: we have {rng.randint(1, 999)} + {rng.randint(1, 999)} = ..."
             for i in range(rng.randint(20, 80))]
    final = answer if correct else answer + 1
    return "\n".join(steps) + f"\nTherefore the result is $\\boxed{{{final}}}$.\nAnswer: {final}"


def test_speed_on_10000_responses():
    rng = random.Random(0)
    answers = [rng.randint(0, 999) for _ in range(10_000)]
    responses = [_realistic_response(rng, a, correct=i % 2 == 0) for i, a in enumerate(answers)]
    started = time.perf_counter()
    results = score_batch(responses, [str(a) for a in answers])
    elapsed = time.perf_counter() - started
    print(f"\nreward: 10000 responses in {elapsed:.3f} s = {10_000 / elapsed:,.0f} responses/s")
    assert accuracy(results) == 0.5
    assert elapsed < 10.0


# ---------------------------------------------------------------- LumenRL's \boxed{} fallback (2232f55)

@pytest.mark.parametrize("response, truth, fallback, expected", [
    (r"so the sum is \boxed{42}", "42", True, (1.0, True, "42")),            # no Answer: line -> the box counts
    (r"so the sum is \boxed{42}", "42", False, (-1.0, False, "[INVALID]")),  # verl's math_dapo: no fallback
    (r"first \boxed{7}, then \boxed{\frac{1}{2}}", r"\frac{1}{2}", True, (1.0, True, r"\frac{1}{2}")),  # the last
    ("Answer: 41\nbut \\boxed{42}", "42", True, (-1.0, False, "41")),          # an Answer: line wins over any box
    (r"unclosed \boxed{42", "42", True, (-1.0, False, "[INVALID]")),           # braces never balance: no answer
    (r"\boxed{5}" + "x" * 300, "5", True, (-1.0, False, "[INVALID]")),        # outside the 300-character tail
])
def test_boxed_fallback_scores_the_last_balanced_box(response, truth, fallback, expected):
    result = score_response(response, truth, "dapo", boxed_fallback=fallback)
    assert (result.score, result.acc, result.pred) == expected


def test_last_boxed_balances_nested_braces():
    assert last_boxed(r"\boxed{\sqrt{\frac{a}{b}}} tail") == r"\sqrt{\frac{a}{b}}"
    assert last_boxed("no box here") is None and last_boxed(r"\boxed{{}") is None
