"""`repro launch --recipe NAME [--dry-run]`: place the groups on the recipe's Ray cluster and start the run.

With ``engine: lumenrl`` in the recipe it starts AMD's LumenRL instead (repro.lumenrl): ``--dry-run`` then prints the
config written from the recipe beside the published one, the environment and the command.

``--dry-run`` places both groups (so the cluster proves it can hold them), prints which node hosts each
worker and bundle, each trainer rank's Megatron coordinates, the vLLM engine arguments and the trainer's memory
budget per rank (repro.readiness.memory_budget), then releases the placement without starting any worker. Without a reachable cluster it prints the plan unplaced and fails.

Without ``--dry-run`` it refuses, naming each, when a worker library (megatron-core, vLLM) is not importable or
``actor.model_provider`` is unset; otherwise it hands over to ``repro run`` (``repro.commands.run.execute``),
whose Ray groups start one actor per trainer rank (one torch.distributed world) and the rollout replica.
"""

from __future__ import annotations

import argparse

from repro.cluster import ClusterError
from repro.cluster.placement import plan_placement
from repro.commands import run as run_command
from repro.lumenrl.launch import LumenRLError, checkout_problems
from repro.readiness import facts
from repro.recipes import list_recipes, load_recipe
from repro.recipes.backends import engine_of
from repro.run.launch import (
    LaunchError, dry_run, format_dry_run, format_memory_budget, launch_blockers, simulated_dry_run, unplaced_rows,
)

DEFAULT_RECIPE = "amd-dsv4-flash-mi308x"


def add_arguments(parser):
    parser.add_argument("--recipe", default=DEFAULT_RECIPE, help=f"committed recipe ({', '.join(list_recipes())}) or YAML path")
    parser.add_argument("--dry-run", action="store_true", help="place and describe every worker, start none")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a recipe field (repeatable), e.g. cluster.ray_address=10.0.0.1:6379")
    parser.add_argument("--steps", type=int, help="optimizer steps (default: the recipe's)")
    parser.add_argument("--run-dir", help="run directory (default: runs/<recipe name>)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    parser.add_argument("--max-restarts", type=int, metavar="N",
                        help="when a worker dies, restart both groups from the newest complete checkpoint, at most N "
                             "times (checkpoint.max_restarts)")
    parser.add_argument("--simulate", action="store_true",
                        help="dry run on a simulated cluster of the recipe's shape (logical GPUs on this machine); "
                             "also what --dry-run does when cluster.ray_address is 'auto' and no cluster is found")
    parser.add_argument("--placement-timeout", type=float, default=120.0, help="seconds to wait for the placement (dry run)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


class NoClusterToJoin(Exception):
    """'auto' found no running cluster on this machine (the dry run then simulates one)."""


def _with_address(recipe):
    """'auto' joins $RAY_ADDRESS or the cluster `ray start` recorded, never a stray local ray.init() instance."""
    import ray

    if ray.is_initialized():
        return recipe
    try:
        address = facts.resolve_address(recipe.cluster.ray_address)
    except facts.NoClusterFound as err:
        raise NoClusterToJoin(f"cluster.ray_address='auto': {err}") from None
    return recipe.model_copy(update={"cluster": recipe.cluster.model_copy(update={"ray_address": address})})


def run(args) -> int:
    recipe = load_recipe(args.recipe, list(args.overrides))
    if not engine_of(recipe).own_loop:  # LumenRL launches its own job
        return launch_lumenrl(args)
    if args.dry_run or args.simulate:
        if args.simulate:
            print(simulated_dry_run(recipe, timeout_s=args.placement_timeout))
            return 0
        try:
            joined = _with_address(recipe)
        except NoClusterToJoin as err:
            print(f"{err}: showing the placement on a simulated cluster instead")
            print(simulated_dry_run(recipe, timeout_s=args.placement_timeout))
            return 0
        try:
            text, _ = dry_run(joined, timeout_s=args.placement_timeout)
        except ClusterError as err:
            plan = plan_placement(recipe)
            print(format_dry_run(recipe, plan, unplaced_rows(plan)))
            raise ClusterError(f"dry run: the plan above could not be placed: {err} "
                               "(`--simulate` shows the placement on a simulated cluster of the recipe's shape)") from None
        print(text)
        return 0
    blockers = launch_blockers(recipe)
    if blockers:
        raise LaunchError(
            f"recipe {recipe.name} cannot be launched from here: {'; '.join(blockers)}. "
            "`repro launch --dry-run` still shows the placement and every worker's arguments"
        )

    run_args = argparse.Namespace(recipe=args.recipe, overrides=list(args.overrides), steps=args.steps,
                                  run_dir=args.run_dir, resume=args.resume, in_process=False, quiet=args.quiet,
                                  max_restarts=args.max_restarts)
    run_command.execute(run_args)
    return 0


def launch_lumenrl(args) -> int:
    """engine lumenrl: the dry run prints the LumenRL config written from the recipe beside the published one, the
    environment, the command and the trainer's memory budget; otherwise the run goes through ``repro run`` (the one
    entry point) to LumenRL."""
    from pathlib import Path

    from repro.lumenrl.run import describe_launch  # torch, pandas: not for `repro launch --help`

    recipe = load_recipe(args.recipe, list(args.overrides), steps=args.steps)
    run_dir = Path(args.run_dir or Path("runs") / recipe.name)
    if args.dry_run or args.simulate:
        print(describe_launch(recipe, run_dir))
        print(format_memory_budget(recipe))
        return 0
    problems = checkout_problems(recipe)
    if problems:
        raise LumenRLError(f"recipe {recipe.name} cannot start LumenRL from here: {'; '.join(problems)}. "
                           "`repro launch --dry-run` still shows the config it would write")

    run_args = argparse.Namespace(recipe=args.recipe, overrides=list(args.overrides), steps=args.steps,
                                  run_dir=args.run_dir, resume=args.resume, in_process=False, quiet=args.quiet,
                                  max_restarts=args.max_restarts)
    run_command.execute(run_args)
    return 0
