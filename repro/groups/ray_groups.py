"""The loop's two groups on Ray, placed by the recipe's plan: the trainer (one embedded worker, or every rank of
a Megatron world) and one rollout worker.

``call`` waits for the result; ``submit`` returns the ObjectRef, which Ray resolves inside the receiving
worker, so weight-sync buckets travel trainer -> rollout through the object store, never via the driver (a
multi-rank trainer gathers its ranks' weights to rank 0 first). A worker that dies is reported by name, with
the newest checkpoint the run can resume from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from repro.run.checkpoints import latest_checkpoint
from repro.groups.ray_actors import WorkerDiedError, start_worker
from repro.cluster.placement import (
    ROLLOUT, TRAINER, create_placement_groups, format_placement_table, placement_table, plan_placement,
)
from repro.groups.ray_ranks import RankGroup, start_ranks
from repro.cluster.runtime import ensure_ray, shutdown_ray
from repro.recipes.schema import Recipe
from repro.errors import ReproError


class RayGroup:
    def __init__(self, ranks: RankGroup, run_dir: Path):
        self.ranks, self.run_dir = ranks, run_dir
        self.name = ranks.name

    def submit(self, method: str, *args: Any) -> Any:
        return self.ranks.submit(method, *args)

    def call(self, method: str, *args: Any) -> Any:
        try:
            return self.ranks.call(method, *args)
        except WorkerDiedError as err:
            newest = latest_checkpoint(Path(self.run_dir) / "checkpoints")
            resume = (f"the last good checkpoint is step {newest.step} ({newest.path}): rerun with --resume"
                      if newest else "no checkpoint was written yet: rerun from the start")
            raise WorkerDiedError(f"{err}; {resume}") from err


class RayGroups:
    """Starts Ray (or joins the recipe's cluster), places both groups, starts the trainer rank(s) and the
    rollout worker."""

    supports_multi_worker = True  # a Megatron trainer of actor.num_workers ranks; still one rollout replica

    def __init__(self, recipe: Recipe, run_dir: str | Path):
        self.recipe, self.run_dir = recipe, Path(run_dir)
        self.placed = None

    def make_groups(self, recipe: Recipe, model_dir: Path, run_dir: Path) -> tuple[RayGroup, RayGroup]:
        check_group_sizes(recipe)
        ensure_ray(recipe)
        self.placed = create_placement_groups(plan_placement(recipe))
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (run_dir / "logs" / "placement.txt").write_text(format_placement_table(placement_table(self.placed)) + "\n")
        spec = recipe.model_dump(mode="json")
        # one thread per worker: each holds one CPU bundle, and oversubscribed small matmuls crawl
        env = {"OMP_NUM_THREADS": "1"} if recipe.cluster.gpus_per_node == 0 else None
        if recipe.actor.backend == "megatron":
            trainer = start_ranks(self.placed, TRAINER, "repro.groups.workers:TrainerWorker", (spec, str(model_dir)),
                                  per_node=recipe.actor.num_workers // recipe.actor.nodes, env=env)
        else:
            trainer = RankGroup([start_worker(self.placed, TRAINER, 0, "repro.groups.workers:TrainerWorker",
                                              (spec, str(model_dir)), env=env)], name="trainer worker 0")
        rollout = RankGroup([start_worker(self.placed, ROLLOUT, 0, "repro.groups.workers:RolloutWorker",
                                          (spec, str(model_dir)), env=env)], name="rollout worker 0")
        return RayGroup(trainer, run_dir), RayGroup(rollout, run_dir)

    def shutdown(self) -> None:
        if self.placed is not None:
            self.placed.remove()
        shutdown_ray()


def check_group_sizes(recipe: Recipe) -> None:
    """Refuse, naming the fields, layouts these groups do not start."""
    if recipe.rollout.num_replicas != 1:
        raise ReproError(
            f"rollout.num_replicas={recipe.rollout.num_replicas}: one rollout replica is started (AMD runs one TP8 "
            "vLLM replica); several replicas need a request router in front of them, not built"
        )
    if recipe.actor.backend == "embedded" and recipe.actor.num_workers != 1:
        raise ReproError(
            f"actor.num_workers={recipe.actor.num_workers}: the embedded trainer is one process; several trainer "
            "ranks need actor.backend: megatron"
        )
