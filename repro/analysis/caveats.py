"""Where a source's numbers are not AMD's quantity: one sentence per difference, read off the frames.

AMD's published numbers: reward accuracy per 25-step phase of a 75-step run; AIME-2024 avg@8 (30 problems) at the
start and at step 75 (the start is the evaluation after step 1: LumenRL never evaluates before the first update, see
repro/reference); rollout throughput as generated tokens/s of the whole 8-GPU rollout node; KL and ESS at step 75
(k1, the estimator LumenRL logs as ``rollout_corr/kl``). Each function returns the sentences for one source;
``source_notes`` all.
"""

from __future__ import annotations

from repro.analysis import formats, summary
from repro.analysis.frame import ACCURACY, ESS, K3_KL, KL, STEP_SECONDS, THROUGHPUT, RunFrames
from repro.metric_keys import POSITION_KEYS, timing_key
from repro.recipes.backends import engine_of, engine_reading, function_named
from repro.reference import amd_reference, amd_value

AMD_STEPS = int(amd_value("steps"))
AMD_START_STEP = int(amd_reference()["aime_avg8_start"].step)
AMD_EVAL_STEPS = (AMD_START_STEP, int(amd_reference()["aime_avg8_end"].step))
LUMENRL_RECIPROCAL_KEYS = ("mismatch/k3_kl", "mismatch/chi2_token", "mismatch/chi2_seq")

KL_ESTIMATORS = (f"`{KL}` is the k1 estimator, the mean of log π_rollout − log π_trainer over response tokens: "
                 "unbiased but noisy, and negative when the noise outweighs the gap; "
                 f"`{K3_KL}` is k3, the mean of ρ − log ρ − 1 with ρ = π_trainer/π_rollout, never negative. "
                 "AMD's 0.4706 is k1: LumenRL logs `rollout_corr/kl` as the per-token mean of log π_rollout − "
                 "log π_trainer (rollout_correction.py:399 at 2232f55; rl_trainer.py:4102–4105 replaces it with the "
                 "token-weighted mean over the whole batch), so the tables set it beside k1.")


def _steps(values) -> str:
    values = [int(v) for v in values]
    if len(values) > 3:
        gaps = {b - a for a, b in zip(values[1:], values[2:])}
        if len(gaps) == 1:
            return f"{values[0]}, {values[1]}, …, {values[-1]} (every {gaps.pop()})"
    return ", ".join(str(v) for v in values)


def length_notes(frames: RunFrames) -> list[str]:
    if frames.train.empty:
        return []
    last, planned = int(frames.train.index.max()), frames.planned_steps
    notes = []
    if planned is not None and last < planned:
        notes.append(f"The run stopped at step {last}, short of its recipe's {planned} steps.")
    if last < AMD_STEPS:
        notes.append(f"{last} steps logged, fewer than AMD's {AMD_STEPS}: \"end\" values are step {last}'s, and the "
                     f"25-step phases after step {last} are partial or empty.")
    return notes


def throughput_notes(frames: RunFrames) -> list[str]:
    origin = frames.origin(THROUGHPUT)
    if THROUGHPUT not in frames.train.columns:
        if "perf/throughput" in frames.train.columns:
            return ["No rollout throughput: verl's `perf/throughput` (prompt + response tokens per second of the whole "
                    "step, per GPU) is a different quantity from AMD's generated tokens/s of the rollout node and is "
                    "not compared."]
        return [f"No rollout throughput (`{THROUGHPUT}`): the throughput rows are empty."]
    hw = summary.hardware(frames)
    if hw is not None and hw.gpus == 0:
        return [f"`{THROUGHPUT}` is generated tokens/s of this CPU run's rollout: another machine and model, shown "
                "but not judged against AMD's MI308X node."]
    if origin == "throughput/gen_tok_per_s":
        where = "from LumenRL's `throughput/gen_tok_per_s` (response tokens / generation wall time of the step): "
    elif origin != THROUGHPUT:
        where = f"derived as {origin}: "
    else:
        where = ""
    per_gpu = (f"per GPU it is divided by the recipe's {hw.rollout_gpus} rollout GPUs" if hw and hw.rollout_gpus
               else "the log carries no GPU count, so there is no per-GPU figure (AMD's node has "
                    f"{int(amd_value('rollout_gpus'))} GPUs)")
    return [f"Rollout throughput {where}the aggregate of the whole rollout group, AMD's unit; {per_gpu}."]


def rollout_logprobs(frames: RunFrames) -> str | None:
    """Which log-prob of each sampled token the source's rollout returned: "raw" (log_softmax(logits), T = 1: vLLM's
    default raw_logprobs, which AMD's run used -- LumenRL sets no logprobs_mode), "processed" (log_softmax(logits / T),
    the distribution sampled from), or None when the source does not say (an export of someone's run)."""
    engine = engine_of(frames.recipe) if frames.recipe is not None else engine_reading(frames.kind)
    if engine is not None and engine.rollout_logprobs == "raw":
        return "raw"
    if frames.recipe is not None:
        # a run dir written before the field existed reads as "processed", what repro's engines then returned
        # (repro.recipes.earlier)
        return frames.recipe.rollout.logprobs_mode
    return None


def logprob_note(frames: RunFrames) -> str | None:
    """Why this source's KL, ESS and KL by position are not AMD's quantity because of its rollout log-probs, or None."""
    mode = rollout_logprobs(frames)
    if mode == "raw":
        return None
    amd = ("AMD's run set the trainer's log_softmax(logits / T) against vLLM's raw log_softmax(logits) at T = 1 "
           "(LumenRL sets no logprobs_mode), so its KL, ESS and KL by position include the temperature")
    if mode == "processed":
        return (f"This source's rollout log-probs are processed, log_softmax(logits / T), the distribution sampled "
                f"from; {amd}: the two measure different things and are set side by side only with this mark.")
    return f"The source does not say whether its rollout log-probs were raw or processed; {amd}."


def kl_notes(frames: RunFrames) -> list[str]:
    notes = []
    missing = [k for k in (KL, K3_KL, ESS) if k not in frames.train.columns]
    if missing:
        notes.append(f"No {', '.join(f'`{k}`' for k in missing)} in this source.")
    if KL in frames.train.columns or ESS in frames.train.columns:
        notes += [n for n in (logprob_note(frames),) if n]
    reciprocal = [k for k in LUMENRL_RECIPROCAL_KEYS if k in frames.train.columns]
    if reciprocal:
        notes.append(f"LumenRL's {', '.join(f'`{k}`' for k in reciprocal)} are computed on π_rollout/π_trainer, the "
                     "reciprocal of the ratio our k3 and χ² use: kept under their own names, drawn in the KL figure "
                     "as LumenRL's k3, and not compared with `rollout_corr/k3_kl`. Only LumenRL's FSDP loss logs them "
                     "(workers/actor_worker.py `_policy_loss_fn`); its DeepSeek-V4 Megatron path, AMD's, never does.")
    return notes


def position_notes(frames: RunFrames) -> list[str]:
    """What the source lacks of LumenRL's KL by response position (``rollout_corr/pos_*``, logged since 2232f55)."""
    present = [k for k in POSITION_KEYS if k in frames.train.columns and frames.train[k].notna().any()]
    if not present:
        return ["No KL by response position (`rollout_corr/pos_*`) in this source (LumenRL logs it since 2232f55, "
                "while its rollout correction is on: rl_trainer.py:4067-4077)."]
    never = sorted({k.rsplit("/", 1)[0] for k in POSITION_KEYS} - {k.rsplit("/", 1)[0] for k in present})
    if never:
        return [f"No tokens ever in {', '.join(f'`{b}`' for b in never)}: a bucket without tokens is not logged."]
    return []


def eval_notes(frames: RunFrames) -> list[str]:
    key = frames.avg_key
    if frames.eval.empty:
        return ["No held-out evaluations: the held-out rows are empty."]
    if key is None:
        return [f"The evaluations at steps {_steps(frames.eval.index)} carry no accuracy "
                "(`val-core/<data source>/acc/mean@k`): the held-out rows are empty."]
    steps = [int(s) for s in frames.eval[key].dropna().index]
    notes = []
    if tuple(steps) != AMD_EVAL_STEPS:
        notes.append(f"Evaluated at step{'s' if len(steps) > 1 else ''} {_steps(steps)}; AMD publishes step "
                     f"{AMD_EVAL_STEPS[0]} and step {AMD_EVAL_STEPS[1]} only.")
    if steps and steps[0] != AMD_START_STEP:
        after = "before any update" if steps[0] == 0 else f"after {steps[0]} updates"
        notes.append(f"\"start\" is step {steps[0]}, {after}; AMD's is the evaluation after the first update "
                     f"(step {AMD_START_STEP}: LumenRL never evaluates before it).")
    k = int(key.split("@")[1])
    if k != int(amd_value("aime_samples_per_problem")):
        notes.append(f"{key}: {k} samples per problem, AMD's avg@8 uses 8.")
    origin = frames.origin(key)
    if origin != key:
        notes.append(f"`{key}` is read from `{origin}`" + (" (LumenRL names validation metrics after the reward "
                     "function, math_dapo, not after the data set)" if "/math_dapo/" in origin else "") + ".")
    if not frames.has_problem_counts:
        notes.append("No per-problem correct counts: held-out accuracy has no bootstrap band.")
    return notes


def timing_notes(frames: RunFrames) -> list[str]:
    origin = frames.origin(STEP_SECONDS)
    notes = []
    if origin == "timing/step_s":
        notes.append("Step time is LumenRL's `timing/step_s`, which stops before weight sync and validation.")
    elif frames.step_time_includes_eval:
        notes.append("`timing_s/step` includes the evaluation time of steps that evaluated (LumenRL's DeepSeek-V4 "
                     "trainer times it inside the step; verl 0.9.1 does not); time-to-train does not add it again.")
    if frames.origin(timing_key("sync")) == "timing/weight_sync_s":
        notes.append("`timing_s/sync` comes from LumenRL's `timing/weight_sync_s`, logged only for syncs above 1 s.")
    return notes


def restart_notes(frames: RunFrames) -> list[str]:
    """The restarts the run made itself (``checkpoint.max_restarts``): each step, worker and call that died, and
    the step it resumed from; the steps after that checkpoint were recomputed, so their rows are the new ones."""
    if not frames.restarts:
        return []
    each = "; ".join(
        f"at step {r.get('step')} {r.get('worker', 'a worker')} died during {r.get('call', '?')}"
        + (f", resumed from step {r['resumed_from']}" if r.get("resumed_from") is not None else "")
        for r in frames.restarts)
    count = len(frames.restarts)
    return [f"The run restarted itself {count} time{'s' if count > 1 else ''} after a worker died ({each}); the "
            "steps after each checkpoint it resumed from were recomputed, and step times are the recomputed steps' "
            "(the time lost to the restarts is in none of them)."]


def engine_notes(frames: RunFrames) -> list[str]:
    """The sentences the engine that ran this source adds (its table row's ``caveats``; none for a source without a
    recipe, whose engine is not known)."""
    caveats = engine_of(frames.recipe).caveats if frames.recipe is not None else None
    return function_named(caveats)(frames) if caveats is not None else []


def source_notes(frames: RunFrames) -> list[str]:
    """Every sentence on where this source differs from what AMD measured, importer notes last."""
    notes = (length_notes(frames) + restart_notes(frames) + eval_notes(frames) + throughput_notes(frames)
             + kl_notes(frames) + position_notes(frames) + timing_notes(frames) + engine_notes(frames)
             + [n if n.endswith(".") else n + "." for n in frames.notes])
    if ACCURACY not in frames.train.columns:
        notes.insert(0, f"No reward accuracy (`{ACCURACY}`, nor a DAPO score to derive it from).")
    return notes


def describe_steps(frames: RunFrames) -> str:
    """'75 steps (1–75), evaluations at 0, 25, 50, 75' in the one format for steps."""
    idx = frames.train.index
    span = f"{formats.step(idx.min())}–{formats.step(idx.max())}" if len(idx) else "none"
    evals = _steps(frames.eval.index) if len(frames.eval.index) else "none"
    return f"{len(idx)} steps ({span}), evaluations at {evals}"
