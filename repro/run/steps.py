"""The named calls of one RL step (``repro.run.loop`` reads as a list of them).

Each takes what it needs explicitly and returns what it made. Those that record write only to the run's records:
``log_step`` and ``evaluate_and_log`` append a row to ``run.metrics`` (and report progress), ``save_rollouts``
and ``save_checkpoint_now`` write files under the run directory, and ``warmup_once`` clears ``run.warmup_s``
once the first row has carried it. The groups are reached through their protocol (``repro.groups.protocol``),
the same in this process and on Ray.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Iterator

import torch

from repro import metric_keys as K
from repro.algos import grpo_advantages, response_token_mean, rollout_corr_metrics
from repro.groups.protocol import RolloutGroup, TrainerGroup
from repro.recipes.schema import Recipe
from repro.reward import RewardResult, accuracy, mean_score, score_response
from repro.rollout.types import FinishReason, RolloutResult, SamplingParams
from repro.run.checkpoints import driver_rng_state, save_checkpoint
from repro.run.rollouts_file import StepTrajectories
from repro.run.state import Run
from repro.sync.apply import SyncStats
from repro.train.batch import TrainBatch, build_batch
from repro.train.grpo_update import old_logprobs_from_update


class StepClock:
    """Wall time of each named phase of a step, logged as ``timing_s/<phase>``."""

    def __init__(self):
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as phase ``name`` (recorded when the block ends without raising)."""
        start = time.perf_counter()
        yield
        self.seconds[name] = time.perf_counter() - start

    def total(self) -> float:
        return time.perf_counter() - self.started


def sampling_seed(seed: int, step: int, purpose: str) -> int:
    """Per-step sampling seed, a function of (run seed, step) only, so a resumed run samples the same."""
    return (seed * 1_000_003 + step * 7919 + (0 if purpose == "train" else 104_729)) % (2**63 - 1)


def request_responses(run: Run, prompts: list[list[int]], params: SamplingParams) -> RolloutResult:
    """``params.n`` responses to each prompt, prompt-major, asked for as ``rollout.requests`` says. ``per_sample``
    sends each prompt n times as n=1 requests, as LumenRL's ``_rollout_with_ray_vllm`` does (rl_trainer.py:614-627
    at 2232f55), and numbers the responses back into their prompt's group; each request is seeded (the engine's
    seed + the request's index), where LumenRL's draw from the engine's generator (seeded 10086 + replica)."""
    n = params.n
    if run.recipe.rollout.requests == "per_prompt" or n == 1:
        return run.rollout.generate(prompts, params)
    result = run.rollout.generate([p for p in prompts for _ in range(n)], replace(params, n=1))
    grouped = [replace(t, prompt_index=t.prompt_index // n, sample_index=t.prompt_index % n)
               for t in result.trajectories]
    return RolloutResult(grouped, result.generated_tokens, result.seconds)


def generate_rollouts(run: Run, problems: list[int], step: int) -> RolloutResult:
    r = run.recipe
    params = SamplingParams(
        n=r.algorithm.responses_per_prompt, temperature=r.rollout.temperature, top_p=r.rollout.top_p,
        top_k=r.rollout.top_k, max_new_tokens=r.lengths.max_response, seed=sampling_seed(r.seed, step, "train"),
    )
    return request_responses(run, [run.train_prompt_ids[i] for i in problems], params)


def score_texts(run: Run, rollout: RolloutResult, ground_truths: list[str]) -> list[RewardResult]:
    rule = run.recipe.reward
    return [
        score_response(run.tokenizer.decode(t.response_ids, skip_special_tokens=True), ground_truths[t.prompt_index],
                       rule.verifier, rule.boxed_fallback)
        for t in rollout.trajectories
    ]


def score_rollouts(run: Run, problems: list[int], rollout: RolloutResult) -> list[RewardResult]:
    return score_texts(run, rollout, [run.train_problems[i].ground_truth for i in problems])


@dataclass(frozen=True)
class GroupedBatch:
    """The padded batch with its GRPO advantages, and how many prompt groups scored all alike (advantage 0)."""

    batch: TrainBatch
    zero_variance_groups: int


def make_train_batch(run: Run, rollout: RolloutResult, rewards: list[RewardResult]) -> GroupedBatch:
    """GRPO advantages over each prompt's group, then the padded batch (routing kept for R3)."""
    group = run.recipe.algorithm.responses_per_prompt
    reward_groups = torch.tensor([r.score for r in rewards], dtype=torch.float32).view(-1, group)
    algorithm = run.recipe.algorithm
    grouped = grpo_advantages(reward_groups, norm_by_std=algorithm.norm_adv_by_std, std=algorithm.adv_std)
    batch = build_batch(rollout.trajectories, grouped.advantages.reshape(-1), run.tokenizer.pad_token_id,
                        run.recipe.routing_replay.enabled)
    return GroupedBatch(batch, grouped.num_zero_variance_groups)


@dataclass(frozen=True)
class PolicyUpdate:
    """The batch with its π_old log-probs, and the update's ``actor/*`` metrics."""

    batch: TrainBatch
    metrics: dict[str, float]


def update_policy(run: Run, clock: StepClock, batch: TrainBatch) -> PolicyUpdate:
    """π_old (routing replayed), then the step's update(s). With one update per step the update's own first
    forward gives π_old of the rows it forwards -- the same numbers a separate pass gives -- and only the rows
    it skips get a no-grad pass (timed as ``update``); otherwise a separate rescoring first (``old_logprob``).
    ``actor/entropy`` is LumenRL's: π_old's entropy over every response token of the batch."""
    if old_logprobs_from_update(run.recipe):
        with clock.phase("update"):
            pi_old, metrics = run.trainer.scored_train_step(batch)
    else:
        with clock.phase("old_logprob"):
            pi_old = run.trainer.logprobs(batch, run.recipe.routing_replay.enabled)
        with clock.phase("update"):
            metrics = run.trainer.train_step(replace(batch, old_logprobs=pi_old.logprobs))
    entropy = {K.ENTROPY: response_token_mean(pi_old.entropy, batch.response_mask)}
    return PolicyUpdate(replace(batch, old_logprobs=pi_old.logprobs), {**metrics, **entropy})


def mismatch_metrics(run: Run, batch: TrainBatch) -> dict[str, float]:
    c = run.recipe.rollout_correction
    return rollout_corr_metrics(
        batch.old_logprobs, batch.rollout_logprobs, batch.response_mask,
        mode=c.mode, threshold=c.threshold, threshold_lower=c.lower_threshold, verl=c.verl_metrics,
    )


def save_rollouts(run: Run, problems: list[int], rollout: RolloutResult, rewards: list[RewardResult],
                  batch: TrainBatch, step: int) -> None:
    """The step's trajectories to rollouts/ (tracking.rollouts; with it off, ``run.rollouts`` does nothing)."""
    run.rollouts.write(step, StepTrajectories([run.train_problems[i] for i in problems], rollout, rewards, batch))


def sync_weights(trainer: TrainerGroup, rollout: RolloutGroup, version: int) -> SyncStats:
    """Trainer -> rollout, streamed in buckets; the rollout checks each on arrival and applies it (FP8 there)."""
    return rollout.receive_weights(trainer.send_weights(version), version)


def log_step(run: Run, step: int, clock: StepClock, rollout: RolloutResult, rewards: list[RewardResult],
             grouped: GroupedBatch, mismatch: dict, update: dict, sync: SyncStats) -> dict:
    lengths = [len(t.response_ids) for t in rollout.trajectories]
    row = {
        K.KIND: "train",
        K.STEP: step,
        K.ACCURACY: accuracy(rewards),
        K.SCORE: mean_score(rewards),
        K.ZERO_VARIANCE_GROUPS: grouped.zero_variance_groups,
        K.RESPONSE_LENGTH: sum(lengths) / len(lengths),
        K.RESPONSE_LENGTH_MAX: max(lengths),
        K.RESPONSE_CLIP_RATIO: sum(t.finish_reason is FinishReason.LENGTH for t in rollout.trajectories) / len(lengths),
        K.THROUGHPUT: rollout.tokens_per_s,
        K.GENERATED_TOKENS: rollout.generated_tokens,
        **mismatch,
        **update,
        K.SYNC_GBPS: sync.gbps,
        K.SYNC_SECONDS: sync.seconds,
        K.SYNC_BYTES: sync.nbytes,
        K.SYNC_BUCKETS: sync.buckets,
        K.SYNC_VERSION: sync.version,
        **{K.timing_key(phase): seconds for phase, seconds in clock.seconds.items()},
        K.STEP_SECONDS: clock.total(),
        **warmup_once(run),
    }
    run.metrics.append(row)
    run.progress(step, row)
    return row


def warmup_once(run: Run) -> dict[str, float]:
    """The groups' start-up time, on the first row this process logs only (it is not a step's or an eval's)."""
    if run.warmup_s is None:
        return {}
    seconds, run.warmup_s = run.warmup_s, None
    return {K.WARMUP_SECONDS: seconds}


def evaluates_after(recipe: Recipe, step: int) -> bool:
    """Whether the held-out set is evaluated after update ``step``: every ``eval.every_steps``, after the last
    step, and after the first when ``eval.after_first_update`` (LumenRL's EvalCallback, which AMD's run had)."""
    e = recipe.eval
    return step % e.every_steps == 0 or step == recipe.steps or (step == 1 and e.after_first_update)


def evaluate_and_log(run: Run, step: int) -> dict:
    """avg@k on the held-out problems at the eval temperature/top_p; per-problem counts go to eval/."""
    r = run.recipe
    start = time.perf_counter()
    params = SamplingParams(
        n=r.eval.samples_per_problem, temperature=r.eval.temperature, top_p=r.eval.top_p,
        max_new_tokens=r.lengths.max_response, seed=sampling_seed(r.seed, step, "eval"),
    )
    rollout = request_responses(run, run.eval_prompt_ids, params)
    results = score_texts(run, rollout, [p.ground_truth for p in run.eval_problems])
    k = r.eval.samples_per_problem
    correct = [sum(x.acc for x in results[i : i + k]) for i in range(0, len(results), k)]
    row = {
        K.KIND: "eval",
        K.STEP: step,
        K.eval_avg_key(k): sum(correct) / (k * len(correct)),
        K.CORRECT_COUNTS: correct,
        K.NUM_PROBLEMS: len(correct),
        K.SAMPLES_PER_PROBLEM: k,
        K.EVAL_SECONDS: time.perf_counter() - start,
        **warmup_once(run),
    }
    details = [
        {"uid": p.uid, "problem": p.problem, "answer": p.ground_truth, "correct": c,
         "sample": run.tokenizer.decode(rollout.trajectories[i * k].response_ids, skip_special_tokens=True)}
        for i, (p, c) in enumerate(zip(run.eval_problems, correct))
    ]
    path = run.run_dir / "eval" / f"step_{step:06d}.json"
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"step": step, **{k2: v for k2, v in row.items() if k2 != K.KIND}, "problems": details},
                              indent=1))
    tmp.replace(path)
    run.metrics.append(row)
    return row


def save_checkpoint_now(run: Run, step: int) -> None:
    state = {"sampler": run.sampler.state(), "driver_rng": driver_rng_state(), "weight_version": step}
    save_checkpoint(run.checkpoint_dir, step, run.trainer, state, run.metrics.path, run.recipe.checkpoint.keep_last,
                    recipe_path=run.run_dir / "recipe.yaml")
