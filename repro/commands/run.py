"""`repro run --recipe NAME [--steps N] [--resume] [--max-restarts N] [--run-dir DIR]`: the RL run, trainer and rollout
on Ray."""

from __future__ import annotations

from pathlib import Path

from repro.recipes import list_recipes, load_recipe
from repro.recipes.backends import engine_of
from repro.run.progress import progress_bar


def add_arguments(parser, default_steps: int | None = None):
    parser.add_argument("--recipe", default="tiny-cpu", help=f"committed recipe ({', '.join(list_recipes())}) or YAML path")
    parser.add_argument("--steps", type=int, default=default_steps, help="optimizer steps (default: the recipe's)")
    parser.add_argument("--run-dir", help="run directory (default: runs/<recipe name>)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    parser.add_argument("--max-restarts", type=int, metavar="N",
                        help="when a worker dies, restart both groups and resume from the newest complete checkpoint, "
                             "at most N times (checkpoint.max_restarts; default: the recipe's, 0)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a recipe field (repeatable)")
    parser.add_argument("--in-process", action="store_true",
                        help="run trainer and rollout in this process instead of Ray actors (debugging)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def execute(args) -> Path:
    """Open (or resume) the run, train, write the parquet copy; returns the run directory."""
    from repro.engines import run_recipe  # torch, transformers: not for `repro run --help`
    from repro.run.state import no_progress

    overrides = list(args.overrides)
    if args.max_restarts is not None:
        overrides.append(f"checkpoint.max_restarts={args.max_restarts}")
    recipe = load_recipe(args.recipe, overrides, steps=args.steps)
    run_dir = Path(args.run_dir or Path("runs") / recipe.name)
    progress = no_progress if args.quiet else progress_bar(recipe.steps)
    try:
        outcome = run_recipe(recipe, run_dir, in_process=args.in_process, resume=args.resume, progress=progress)
    finally:
        getattr(progress, "close", lambda: None)()
    if not outcome.already_finished:
        print(f"run finished in {outcome.seconds:.1f} s (warm-up {outcome.warmup_s:.1f} s): {run_dir} "
              f"({', '.join(run_records(recipe))})")
    return run_dir


def run_records(recipe) -> list[str]:
    """What the run directory holds for a reader, as the recipe's tracking section decided."""
    tracking = recipe.tracking
    records = ["metrics.jsonl", "metrics.parquet", "eval/", "checkpoints/"]
    records += ["rollouts/ (repro rollouts RUN --step N)"] if tracking.rollouts and engine_of(recipe).own_loop else []
    records += ["tensorboard/"] if tracking.tensorboard else []
    records += [f"wandb/ ({tracking.wandb.mode})"] if tracking.wandb.enabled else []
    return records


def run(args) -> int:
    execute(args)
    return 0
