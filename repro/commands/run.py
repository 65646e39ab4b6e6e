"""`repro run --recipe NAME [--steps N] [--resume] [--max-restarts N] [--run-dir DIR]`: the RL run, trainer and rollout
on Ray."""

from __future__ import annotations

from pathlib import Path

from repro.recipes import list_recipes, load_recipe
from repro.recipes.backends import engine_of
from repro.recipes.resume import load_run_recipe, recipe_path

DEFAULT_RECIPE = "tiny-cpu"
from repro.run.progress import progress_bar


def add_arguments(parser, default_steps: int | None = None):
    parser.add_argument("--recipe", default=None, help=f"committed recipe ({', '.join(list_recipes())}) or YAML path "
                                                        f"(default {DEFAULT_RECIPE}; with --resume, the run's own)")
    parser.add_argument("--steps", type=int, default=default_steps, help="optimizer steps (default: the recipe's)")
    parser.add_argument("--run-dir", help="run directory (default: runs/<recipe name>)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest checkpoint that verifies, with the recipe the run started "
                             "with (RUN_DIR/recipe.yaml); only --steps, tracking, checkpoint cadence, restarts and "
                             "timeouts may change (repro/recipes/resume.py)")
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
    recipe = run_recipe_of(args, overrides)
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


def run_recipe_of(args, overrides: list[str]):
    """The recipe to run: ``--recipe`` (default tiny-cpu); with ``--resume`` and no ``--recipe``, the one the run
    in ``--run-dir`` (default runs/tiny-cpu) started with, as its recipe.yaml records it."""
    if args.recipe is None and args.resume:
        stored = recipe_path(args.run_dir or Path("runs") / load_recipe(DEFAULT_RECIPE).name)
        if stored.is_file():
            return load_run_recipe(stored, overrides, steps=args.steps)
    return load_recipe(args.recipe or DEFAULT_RECIPE, overrides, steps=args.steps)


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
