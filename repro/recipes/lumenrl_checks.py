"""What keeps a recipe from running on AMD's LumenRL (``engine: lumenrl``): checked with the recipe's other
cross-field checks (``repro.recipes.consistency``), so a recipe LumenRL cannot run is refused when it is loaded,
naming each field. Only recipe fields are read here; writing LumenRL's config from them is ``repro.lumenrl.config``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe

DAPO_REWARD = "lumenrl.rewards.math_reward.compute_math_reward"  # what the trainer calls (rl_trainer.py:2087)
TRAINING_BACKEND = "megatron_lumen_dsv4"  # LumenRL's DeepSeek-V4 Megatron engine


def lumenrl_problems(recipe: "Recipe") -> list[str]:
    """What keeps this recipe from running on LumenRL, one ``field: why`` line each (empty: it can)."""
    problems = []
    if not recipe.lumenrl.path:
        problems.append("lumenrl.path: required when engine is lumenrl (the LumenRL checkout on the Ray head)")
    if recipe.actor.backend != "megatron":
        problems.append(f"actor.backend: LumenRL trains with its Megatron DeepSeek-V4 engine ({TRAINING_BACKEND}); "
                        f"{recipe.actor.backend!r} has no LumenRL counterpart")
    if recipe.rollout.backend != "vllm":
        problems.append(f"rollout.backend: LumenRL's DeepSeek-V4 rollout is vLLM; {recipe.rollout.backend!r} has no "
                        "LumenRL counterpart")
    if recipe.weight_sync.transport != "rdma":
        problems.append(f"weight_sync.transport: LumenRL syncs a separate rollout node over rdma; "
                        f"{recipe.weight_sync.transport!r} has no LumenRL counterpart")
    if recipe.algorithm.updates_per_step != 1:
        problems.append("algorithm.updates_per_step: LumenRL takes train_global_batch_size / num_generations prompts "
                        "per step, so one update per rollout batch is all a recipe can express")
    if not recipe.algorithm.norm_adv_by_std:
        problems.append("algorithm.norm_adv_by_std: LumenRL's grpo estimator always divides by the group std")
    if recipe.algorithm.entropy_coef != 0:
        problems.append("algorithm.entropy_coef: LumenRL's GRPO config has no entropy bonus")
    if recipe.rollout_correction.mode.endswith("_mask"):
        problems.append(f"rollout_correction.mode: {recipe.rollout_correction.mode!r} is not mapped to LumenRL "
                        "(token, sequence and none are)")
    # conventions LumenRL's code fixes (docs/fidelity.md): a recipe that asks otherwise cannot be run by it
    if recipe.rollout.logprobs_mode != "raw":
        problems.append("rollout.logprobs_mode: LumenRL passes no logprobs_mode to vLLM (rl_trainer.py:439-470), so "
                        "its rollout log-probs are vLLM's default raw ones; 'processed' is repro's")
    if recipe.algorithm.clip_ratio_c is not None:
        problems.append("algorithm.clip_ratio_c: LumenRL's GRPO loss on the Megatron path takes no dual-clip "
                        "(megatron_engine.py:2498-2511)")
    if recipe.algorithm.adv_std != "population":
        problems.append("algorithm.adv_std: LumenRL's grpo estimator divides by the population std "
                        "(advantage_estimators.py:167)")
    if not recipe.reward.boxed_fallback:
        problems.append("reward.boxed_fallback: LumenRL's reward always scores the last \\boxed{} of a response "
                        "without an 'Answer:' line (rewards/math_reward.py:97-99)")
    if recipe.data.order != "randperm":
        problems.append("data.order: LumenRL reads the rows in one torch.randperm order (rl_trainer.py:1231-1259); "
                        f"{recipe.data.order!r} is repro's")
    if recipe.rollout.requests != "per_sample":
        problems.append("rollout.requests: LumenRL sends each prompt once per response, n=1 (rl_trainer.py:614-627); "
                        f"{recipe.rollout.requests!r} is repro's")
    if recipe.data.chat_encoding != "auto":
        problems.append(f"data.chat_encoding: LumenRL formats prompts with the tokenizer's chat template, else "
                        f"DeepSeek-V4's encoder (rl_trainer.py:65-85); {recipe.data.chat_encoding!r} is repro's")
    for name, dataset in (("data.train", recipe.data.train), ("data.eval", recipe.data.eval)):
        if dataset.template != "stored":
            problems.append(f"{name}.template: LumenRL prompts with the row's messages as stored "
                            f"(rl_trainer.py:1467-1480); {dataset.template!r} is repro's")
    if not recipe.eval.answer_format:
        problems.append("eval.answer_format: LumenRL's evaluation always appends its answer-format line "
                        "(rl_trainer.py:4253, 1499-1513)")
    if recipe.optim.weight_decay_rule != "megatron":
        problems.append("optim.weight_decay_rule: LumenRL's engine builds megatron's param groups and "
                        "OptimizerParamScheduler, which never decay biases and 1-D parameters "
                        "(megatron_lumen_dsv4_engine.py:1038-1049)")
    for name, dataset in (("data.train", recipe.data.train), ("data.eval", recipe.data.eval)):
        if dataset.dedupe:
            problems.append(f"{name}.dedupe: LumenRL reads every row of the file; dedupe it beforehand")
    if recipe.reward.verifier != "dapo":
        problems.append(f"reward.verifier: LumenRL scores with {DAPO_REWARD}; {recipe.reward.verifier!r} is ours")
    for name, dataset in (("data.train", recipe.data.train), ("data.eval", recipe.data.eval)):
        if dataset.kind.startswith("tiny_math"):
            problems.append(f"{name}.kind: LumenRL reads dataset files; {dataset.kind!r} is generated by repro")
    if recipe.model.path.startswith("builtin:"):
        problems.append(f"model.path: LumenRL loads a checkpoint folder, not {recipe.model.path!r}")
    return problems
