"""`repro run --recipe NAME [--steps N] [--resume] [--run-dir DIR]`: the RL run, trainer and rollout on Ray."""

from __future__ import annotations

import time
from pathlib import Path

from repro.recipes import list_recipes, load_recipe


def add_arguments(parser, default_steps: int | None = None):
    parser.add_argument("--recipe", default="tiny-cpu", help=f"committed recipe ({', '.join(list_recipes())}) or YAML path")
    parser.add_argument("--steps", type=int, default=default_steps, help="optimizer steps (default: the recipe's)")
    parser.add_argument("--run-dir", help="run directory (default: runs/<recipe name>)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a recipe field (repeatable)")
    parser.add_argument("--in-process", action="store_true",
                        help="run trainer and rollout in this process instead of Ray actors (debugging)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def progress_bar(total_steps: int, start_step: int):
    from tqdm import tqdm

    bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)

    def update(step: int, row: dict) -> None:
        bar.set_postfix(
            acc=f"{row['reward/accuracy']:.3f}", kl=f"{row['rollout_corr/kl']:+.4f}",
            ess=f"{row['rollout_corr/rollout_is_eff_sample_size']:.3f}", tok_s=f"{row['perf/rollout_tokens_per_s']:.0f}",
        )
        bar.update(step - bar.n)

    update.close = bar.close
    return update


def execute(args) -> Path:
    """Open (or resume) the run, train, write the parquet copy; returns the run directory."""
    from repro.run.loop import train
    from repro.run.run_dir import local_groups, open_run

    overrides = list(args.overrides) + ([f"steps={args.steps}"] if args.steps else [])
    recipe = load_recipe(args.recipe, overrides)
    run_dir = Path(args.run_dir or Path("runs") / recipe.name)
    if args.in_process:
        groups, cluster = local_groups, None
    else:
        from repro.groups.ray_groups import RayGroups

        cluster = RayGroups(recipe, run_dir)
        groups = cluster.make_groups
    started = time.perf_counter()
    try:
        run = open_run(recipe, run_dir, resume=args.resume, groups=groups)
        if not args.quiet:
            run.progress = progress_bar(recipe.steps, run.start_step)
        try:
            train(run)
        finally:
            getattr(run.progress, "close", lambda: None)()
        run.metrics.write_parquet()
    finally:
        if cluster is not None:
            cluster.shutdown()
    print(f"run finished in {time.perf_counter() - started:.1f} s: {run_dir} (metrics.jsonl, metrics.parquet, eval/, checkpoints/)")
    return run_dir


def run(args) -> int:
    execute(args)
    return 0
