"""`repro launch --recipe NAME [--dry-run]`: start the run on the recipe's cluster through its engine.

What a dry run prints and what a launch needs are the engine's (``repro.engine_seam``): for ``engine: repro`` the
dry run places both groups (so the cluster proves it can hold them), prints which node hosts each worker and bundle,
each trainer rank's Megatron coordinates, the vLLM engine arguments and the trainer's memory budget per rank
(repro.readiness.memory_budget), then releases the placement without starting any worker (without a reachable
cluster it prints the plan unplaced and fails); for an engine that launches a program of its own (LumenRL, verl) it
prints the config written from the recipe beside the published one, the environment, the command and the memory
budget.

Without ``--dry-run`` the engine refuses, naming each, what this machine lacks to start it (a worker library, an
unset ``actor.model_provider``, the engine's checkout or package); otherwise it hands over to ``repro run``
(``repro.commands.run.execute``), the one entry point to a run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from repro.commands import run as run_command
from repro.engine_seam import seam_of
from repro.recipes import list_recipes, load_recipe

DEFAULT_RECIPE = "amd-dsv4-flash-mi308x"


def add_arguments(parser):
    parser.add_argument("--recipe", default=DEFAULT_RECIPE,
                        help=f"committed recipe ({', '.join(list_recipes())}) or YAML path")
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
    parser.add_argument("--placement-timeout", type=float, default=120.0,
                        help="seconds to wait for the placement (dry run)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args) -> int:
    recipe = load_recipe(args.recipe, list(args.overrides), steps=args.steps)
    seam = seam_of(recipe)  # the engine's own modules (torch, pandas): not for `repro launch --help`
    if args.dry_run or args.simulate:
        run_dir = Path(args.run_dir or Path("runs") / recipe.name)
        seam.dry_run(recipe, run_dir, simulate=args.simulate, timeout_s=args.placement_timeout, say=print)
        return 0
    seam.check_launch(recipe)
    run_args = argparse.Namespace(recipe=args.recipe, overrides=list(args.overrides), steps=args.steps,
                                  run_dir=args.run_dir, resume=args.resume, in_process=False, quiet=args.quiet,
                                  max_restarts=args.max_restarts)
    run_command.execute(run_args)
    return 0
