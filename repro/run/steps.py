"""The named calls of one RL step (repro/run/loop.py reads as a list of them). Each takes the ``Run``."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import torch

from repro.algos import grpo_advantages, rollout_corr_metrics
from repro.run.checkpoints import driver_rng_state, save_checkpoint
from repro.reward import RewardResult, accuracy, mean_score, score_response
from repro.rollout.types import FinishReason, RolloutResult, SamplingParams
from repro.run.state import Run
from repro.sync import SyncStats
from repro.train.batch import TrainBatch, build_batch


class StepClock:
    """Wall time of each named phase of a step, logged as ``timing_s/<phase>``."""

    def __init__(self):
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def time(self, phase: str, fn, *args):
        start = time.perf_counter()
        out = fn(*args)
        self.seconds[phase] = time.perf_counter() - start
        return out

    def total(self) -> float:
        return time.perf_counter() - self.started


def sampling_seed(seed: int, step: int, purpose: str) -> int:
    """Per-step sampling seed, a function of (run seed, step) only, so a resumed run samples the same."""
    return (seed * 1_000_003 + step * 7919 + (0 if purpose == "train" else 104_729)) % (2**63 - 1)


def generate_rollouts(run: Run, problems: list[int], step: int) -> RolloutResult:
    r = run.recipe
    params = SamplingParams(
        n=r.algorithm.responses_per_prompt, temperature=r.rollout.temperature, top_p=r.rollout.top_p,
        top_k=r.rollout.top_k, max_new_tokens=r.lengths.max_response, seed=sampling_seed(r.seed, step, "train"),
    )
    return run.rollout.call("generate", [run.train_prompt_ids[i] for i in problems], params)


def score_texts(run: Run, rollout: RolloutResult, ground_truths: list[str]) -> list[RewardResult]:
    verifier = run.recipe.reward.verifier
    return [
        score_response(run.tokenizer.decode(t.response_ids, skip_special_tokens=True), ground_truths[t.prompt_index], verifier)
        for t in rollout.trajectories
    ]


def score_rollouts(run: Run, problems: list[int], rollout: RolloutResult) -> list[RewardResult]:
    return score_texts(run, rollout, [run.train_problems[i].ground_truth for i in problems])


def make_train_batch(run: Run, rollout: RolloutResult, rewards: list[RewardResult]) -> TrainBatch:
    """GRPO advantages over each prompt's group, then the padded batch (routing kept for R3)."""
    group = run.recipe.algorithm.responses_per_prompt
    scores = torch.tensor([r.score for r in rewards], dtype=torch.float32).view(-1, group)
    advantages = grpo_advantages(scores, norm_by_std=run.recipe.algorithm.norm_adv_by_std).advantages.reshape(-1)
    return build_batch(rollout.trajectories, advantages, run.tokenizer.pad_token_id, run.recipe.routing_replay.enabled)


def rescore_with_replay(run: Run, batch: TrainBatch) -> None:
    """π_old: the trainer's own log-probs of the sampled tokens, with the rollout's experts replayed (R3)."""
    result = run.trainer.call("logprobs", batch, run.recipe.routing_replay.enabled)
    batch.old_logprobs = result.logprobs


def mismatch_metrics(run: Run, batch: TrainBatch) -> dict[str, float]:
    c = run.recipe.rollout_correction
    return rollout_corr_metrics(
        batch.old_logprobs, batch.rollout_logprobs, batch.response_mask,
        mode=c.mode, threshold=c.threshold, threshold_lower=c.lower_threshold,
    )


def update_actor(run: Run, batch: TrainBatch) -> dict[str, float]:
    return run.trainer.call("train_step", batch)


def sync_weights(run: Run, version: int) -> SyncStats:
    """Trainer -> rollout in buckets; the rollout verifies the whole set, re-quantises to FP8 and swaps."""
    buckets = run.trainer.submit("weight_buckets", version)
    return run.rollout.call("apply_buckets", buckets, version)


def _zero_variance_groups(rewards: list[RewardResult], group: int) -> int:
    scores = [r.score for r in rewards]
    return sum(len(set(scores[i : i + group])) == 1 for i in range(0, len(scores), group))


def log_step(run: Run, step: int, clock: StepClock, rollout: RolloutResult, rewards, mismatch, update, sync) -> dict:
    lengths = [len(t.response_ids) for t in rollout.trajectories]
    row = {
        "kind": "train",
        "step": step,
        "reward/accuracy": accuracy(rewards),
        "critic/score/mean": mean_score(rewards),
        "grpo/zero_variance_groups": _zero_variance_groups(rewards, run.recipe.algorithm.responses_per_prompt),
        "response_length/mean": sum(lengths) / len(lengths),
        "response_length/max": max(lengths),
        "response_length/clip_ratio": sum(t.finish_reason is FinishReason.LENGTH for t in rollout.trajectories) / len(lengths),
        "perf/rollout_tokens_per_s": rollout.tokens_per_s,
        "perf/generated_tokens": rollout.generated_tokens,
        **mismatch,
        **update,
        "weight_sync/gbps": sync.gbps,
        "weight_sync/seconds": sync.seconds,
        "weight_sync/bytes": sync.nbytes,
        "weight_sync/buckets": sync.buckets,
        "weight_sync/version": sync.version,
        **{f"timing_s/{phase}": seconds for phase, seconds in clock.seconds.items()},
        "timing_s/step": clock.total(),
    }
    run.metrics.append(row)
    run.progress(step, row)
    return row


def evaluate_and_log(run: Run, step: int) -> dict:
    """avg@k on the held-out problems at the eval temperature/top_p; per-problem counts go to eval/."""
    r = run.recipe
    start = time.perf_counter()
    params = SamplingParams(
        n=r.eval.samples_per_problem, temperature=r.eval.temperature, top_p=r.eval.top_p,
        max_new_tokens=r.lengths.max_response, seed=sampling_seed(r.seed, step, "eval"),
    )
    rollout = run.rollout.call("generate", run.eval_prompt_ids, params)
    results = score_texts(run, rollout, [p.ground_truth for p in run.eval_problems])
    k = r.eval.samples_per_problem
    correct = [sum(x.acc for x in results[i : i + k]) for i in range(0, len(results), k)]
    row = {
        "kind": "eval",
        "step": step,
        f"eval/avg@{k}": sum(correct) / (k * len(correct)),
        "eval/correct_counts": correct,
        "eval/num_problems": len(correct),
        "eval/samples_per_problem": k,
        "timing_s/eval": time.perf_counter() - start,
    }
    details = [
        {"uid": p.uid, "problem": p.problem, "answer": p.ground_truth, "correct": c,
         "sample": run.tokenizer.decode(rollout.trajectories[i * k].response_ids, skip_special_tokens=True)}
        for i, (p, c) in enumerate(zip(run.eval_problems, correct))
    ]
    path = run.run_dir / "eval" / f"step_{step:06d}.json"
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"step": step, **{k2: v for k2, v in row.items() if k2 != "kind"}, "problems": details}, indent=1))
    tmp.replace(path)
    run.metrics.append(row)
    return row


@dataclass
class _TrainerSaver:
    run: Run

    def save(self, directory):
        return self.run.trainer.call("save", str(directory))


def save_checkpoint_now(run: Run, step: int) -> None:
    state = {"sampler": run.sampler.state(), "driver_rng": driver_rng_state(), "weight_version": step}
    save_checkpoint(run.checkpoint_dir, step, _TrainerSaver(run), state, run.metrics.path, run.recipe.checkpoint.keep_last)
