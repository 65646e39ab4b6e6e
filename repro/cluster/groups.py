"""The loop's two groups on Ray: one trainer worker and one rollout worker placed by the recipe's plan.

``call`` waits for the result; ``submit`` returns the ObjectRef, which Ray resolves inside the receiving
worker, so weight-sync buckets travel trainer -> rollout through the object store, never via the driver.
A worker that dies is reported by name, with the newest checkpoint the run can resume from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from repro.checkpoint import latest_checkpoint
from repro.cluster.actors import WorkerDiedError, WorkerHandle, start_worker
from repro.cluster.placement import create_placement_groups, format_placement_table, placement_table, plan_placement
from repro.cluster.runtime import ensure_ray, shutdown_ray
from repro.config import Recipe
from repro.errors import ReproError


class RayGroup:
    def __init__(self, worker: WorkerHandle, run_dir: Path):
        self.worker, self.run_dir = worker, run_dir
        self.name = worker.name

    def submit(self, method: str, *args: Any) -> Any:
        return self.worker.actor.invoke.remote(method, *args)

    def call(self, method: str, *args: Any) -> Any:
        import ray
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        try:
            return ray.get(self.submit(method, *args))
        except (ActorDiedError, ActorUnavailableError, RayActorError) as err:
            newest = latest_checkpoint(Path(self.run_dir) / "checkpoints")
            resume = (f"the last good checkpoint is step {newest.step} ({newest.path}): rerun with --resume"
                      if newest else "no checkpoint was written yet: rerun from the start")
            cause = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise WorkerDiedError(f"{self.name} died during {method} ({cause}); {resume}") from err


class RayGroups:
    """Starts Ray (or joins the recipe's cluster), places both groups, starts one worker in each."""

    def __init__(self, recipe: Recipe, run_dir: str | Path):
        self.recipe, self.run_dir = recipe, Path(run_dir)
        self.placed = None

    def make_groups(self, recipe: Recipe, model_dir: Path, run_dir: Path) -> tuple[RayGroup, RayGroup]:
        if recipe.actor.num_workers != 1 or recipe.rollout.num_replicas != 1:
            raise ReproError(
                f"actor.num_workers={recipe.actor.num_workers}, rollout.num_replicas={recipe.rollout.num_replicas}: "
                "the embedded backends run one trainer and one rollout worker; multi-worker groups need the "
                "Megatron-core / vLLM backends"
            )
        ensure_ray(recipe)
        self.placed = create_placement_groups(plan_placement(recipe))
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (run_dir / "logs" / "placement.txt").write_text(format_placement_table(placement_table(self.placed)) + "\n")
        spec = recipe.model_dump(mode="json")
        # one thread per worker: each holds one CPU bundle, and oversubscribed small matmuls crawl
        env = {"OMP_NUM_THREADS": "1"} if recipe.cluster.gpus_per_node == 0 else None
        trainer = start_worker(self.placed, "trainer", 0, "repro.workers:TrainerWorker", (spec, str(model_dir)), env=env)
        rollout = start_worker(self.placed, "rollout", 0, "repro.workers:RolloutWorker", (spec, str(model_dir)), env=env)
        return RayGroup(trainer, run_dir), RayGroup(rollout, run_dir)

    def shutdown(self) -> None:
        if self.placed is not None:
            self.placed.remove()
        shutdown_ray()
