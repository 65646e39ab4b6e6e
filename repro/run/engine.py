"""repro's own loop as an engine (``engine: repro``): its seam (``repro.engine_seam``). The plan and the run are
``repro.run.start``'s; the dry run places both Ray groups on the recipe's cluster (or a simulated one) and prints
each worker, as ``repro launch --dry-run`` always has; a launch needs the recipe's worker libraries here."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from repro.engine_seam import EngineSeam
from repro.recipes.schema import Recipe
from repro.run.checkpoints import Checkpoint, latest_checkpoint
from repro.run.start import plan_repro_run, run_repro


class NoClusterToJoin(Exception):
    """'auto' found no running cluster on this machine (the dry run then simulates one)."""


def _with_address(recipe: Recipe) -> Recipe:
    """'auto' joins $RAY_ADDRESS or the cluster `ray start` recorded, never a stray local ray.init() instance."""
    import ray

    from repro.readiness import facts

    if ray.is_initialized():
        return recipe
    try:
        address = facts.resolve_address(recipe.cluster.ray_address)
    except facts.NoClusterFound as err:
        raise NoClusterToJoin(f"cluster.ray_address='auto': {err}") from None
    return recipe.model_copy(update={"cluster": recipe.cluster.model_copy(update={"ray_address": address})})


def dry_run(recipe: Recipe, run_dir: Path, *, simulate: bool, timeout_s: float, say: Callable[[str], None]) -> None:
    """Place both groups (so the cluster proves it can hold them) and print every worker; release the placement."""
    from repro.cluster import ClusterError
    from repro.cluster.placement import plan_placement
    from repro.run.launch import dry_run as placed_dry_run, format_dry_run, simulated_dry_run, unplaced_rows

    if simulate:
        say(simulated_dry_run(recipe, timeout_s=timeout_s))
        return
    try:
        joined = _with_address(recipe)
    except NoClusterToJoin as err:
        say(f"{err}: showing the placement on a simulated cluster instead")
        say(simulated_dry_run(recipe, timeout_s=timeout_s))
        return
    try:
        text, _ = placed_dry_run(joined, timeout_s=timeout_s)
    except ClusterError as err:
        plan = plan_placement(recipe)
        say(format_dry_run(recipe, plan, unplaced_rows(plan)))
        raise ClusterError(f"dry run: the plan above could not be placed: {err} "
                           "(`--simulate` shows the placement on a simulated cluster of the recipe's shape)") from None
    say(text)


def check_launch(recipe: Recipe) -> None:
    from repro.run.launch import LaunchError, launch_blockers

    blockers = launch_blockers(recipe)
    if blockers:
        raise LaunchError(
            f"recipe {recipe.name} cannot be launched from here: {'; '.join(blockers)}. "
            "`repro launch --dry-run` still shows the placement and every worker's arguments"
        )


def resume_point(recipe: Recipe, run_dir: Path) -> Checkpoint | None:
    return latest_checkpoint(Path(run_dir) / "checkpoints")


SEAM = EngineSeam(plan=plan_repro_run, run=run_repro, dry_run=dry_run, check_launch=check_launch,
                  latest_checkpoint=resume_point)
