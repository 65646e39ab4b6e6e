"""What repro ran before each of AMD's conventions became a recipe field (2026-12-05, the fidelity work).

A run directory keeps its resolved ``recipe.yaml``. One written before a field existed lacks the key, and read with
today's defaults -- AMD's conventions -- it would claim a convention that run did not have (raw rollout log-probs,
say, where it ran processed ones). Readers fill such keys with the value the code then had, and say so; a resume
refuses to switch a run's conventions halfway unless they are given again.
"""

from __future__ import annotations

# dotted field -> the value the code had before the field existed
EARLIER_CONVENTIONS: dict[str, object] = {
    "rollout.logprobs_mode": "processed",
    "rollout.disable_custom_all_reduce": False,
    "algorithm.clip_ratio_c": 3.0,
    "algorithm.adv_std": "sample",
    "reward.boxed_fallback": False,
    "eval.after_first_update": False,
    "data.train.dedupe": True,
    "data.eval.dedupe": True,
    "optim.weight_decay_rule": "all",
    "data.chat_encoding": "none",  # BOS + text: what every tokenizer without a chat template got (the tiny one's)
    "eval.answer_format": False,
    "data.order": "epochs",
    "rollout.requests": "per_prompt",
}
# the earlier IS statistics were verl's, under the rollout_corr/ keys
EARLIER_IS_METRICS_NOTE = ("its rollout_corr/rollout_is_* statistics are verl's (ESS and std on the weights clamped "
                           "to [1/C, C], mean/max/min of the untruncated weights), not LumenRL's, "
                           "which AMD's run logged")


def fill_earlier_conventions(data: dict) -> list[str]:
    """Fill, in place, the convention keys a resolved recipe mapping lacks with the values repro then ran; returns
    the dotted keys filled (none for a recipe written since). Only a mapping that is a whole resolved recipe (it has
    a ``rollout`` section) is touched: a hand-written recipe file means today's defaults."""
    if not isinstance(data.get("rollout"), dict):
        return []
    filled = []
    for dotted, value in EARLIER_CONVENTIONS.items():
        *sections, key = dotted.split(".")
        node = data
        for section in sections:
            node = node.setdefault(section, {}) if isinstance(node, dict) else None
        if isinstance(node, dict) and key not in node:
            node[key] = value
            filled.append(dotted)
    return filled
