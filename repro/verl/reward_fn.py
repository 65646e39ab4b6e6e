"""The reward verl calls for an ``engine: verl`` run (``reward.custom_reward_function.path`` = this file, ``name`` =
``compute_score``): repro's DAPO rule, with LumenRL's ``\\boxed{}`` fallback when the recipe's
``reward.boxed_fallback`` says so (passed as ``reward_kwargs``).

Why not verl's own ``math_dapo``: since 0.9.x it also falls back to ``\\boxed{}`` when the ``Answer:`` line fails, but
by other rules (its strict-box check compares the boxed text without our normalisation, so ``\\boxed{ 12 }`` against
``12`` scores -1 there and +1 in LumenRL's rule and ours); tests/verl holds the two side by side on verl's own code.

verl imports this file by path inside its reward workers, so it imports nothing but ``repro.reward`` (repro must be
installed in the image verl runs in, as for the other engines). Signature: verl's ``compute_score(data_source,
solution_str, ground_truth, extra_info, **reward_kwargs)``; the result's ``acc`` and ``pred`` become verl's
``reward_extra_info``, as ``math_dapo``'s do.
"""

from __future__ import annotations

from typing import Any

from repro.reward import score_response


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None,
                  boxed_fallback: bool = True, verifier: str = "dapo", **_: Any) -> dict[str, Any]:
    result = score_response(solution_str, ground_truth, verifier=verifier, boxed_fallback=boxed_fallback)
    return {"score": result.score, "acc": result.acc, "pred": result.pred}
