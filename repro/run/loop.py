"""The RL loop of AMD's DeepSeek-V4-Flash recipe: GRPO with an FP8 rollout, R3 and token-level TIS.

Each step: 32 prompts -> 8 responses each from the rollout (FP8 weights, routing recorded) -> DAPO reward ->
GRPO advantages -> one update with truncated importance weights (cap 2.0), the old log-probs from the trainer
with the rollout's routing replayed (from the update's own forward when exact) -> mismatch metrics (KL, ESS)
-> the step's trajectories to rollouts/ -> the new weights are sent to the rollout in buckets and re-quantised to
FP8 there -> log (metrics.jsonl; from there TensorBoard and W&B when the recipe's ``tracking`` asks). Evaluate
avg@8 on the held-out set after step 1 and every ``eval.every_steps`` (AMD: 5), checkpoint every 25 steps.

Where this departs from the published run, and why: on a CPU the trainer is the embedded torch trainer and
the rollout the embedded engine (the Megatron-core and vLLM backends implement the same calls); everything
else -- batch shape, loss, correction, replay, sync, checkpoint cadence, metrics -- is the recipe's.

Launch:  repro run --recipe tiny-cpu [--steps N] [--resume] [--run-dir DIR];  repro smoke  (3 steps);
         the notebooks 02/03; all through repro.engines.run_recipe
"""

from __future__ import annotations

from repro.run.restarts import at_step
from repro.run.state import Run
from repro.run.steps import (
    StepClock, evaluate_and_log, evaluates_after, generate_rollouts, log_step, make_train_batch, mismatch_metrics,
    save_checkpoint_now, save_rollouts, score_rollouts, sync_weights, update_policy,
)


def train(run: Run) -> None:
    """Run steps ``run.start_step + 1 .. recipe.steps``; ``run`` holds the groups, data and logs. A failure inside
    a step (a worker's, a write's) is raised as ``repro.run.restarts.StepFailed`` naming the step."""
    recipe = run.recipe
    if run.start_step == 0 and recipe.eval.at_start:
        with at_step(0):
            evaluate_and_log(run, step=0)
    for step in range(run.start_step + 1, recipe.steps + 1):
        with at_step(step):
            clock = StepClock()
            problems = run.sampler.next_batch()
            with clock.phase("rollout"):
                rollout = generate_rollouts(run, problems, step)
            with clock.phase("reward"):
                rewards = score_rollouts(run, problems, rollout)
            grouped = make_train_batch(run, rollout, rewards)
            updated = update_policy(run, clock, grouped.batch)
            mismatch = mismatch_metrics(run, updated.batch)
            with clock.phase("rollouts_file"):
                save_rollouts(run, problems, rollout, rewards, updated.batch, step)
            with clock.phase("sync"):
                sync = sync_weights(run.trainer, run.rollout, step)
            log_step(run, step, clock, rollout, rewards, grouped, mismatch, updated.metrics, sync)
            if evaluates_after(recipe, step):
                evaluate_and_log(run, step)
            if step % recipe.checkpoint.every_steps == 0 or step == recipe.steps:
                save_checkpoint_now(run, step)
