"""`repro smoke`: 3 optimizer steps of a recipe, as AMD's post smoke-tests the setup before the long run."""

from repro.commands import run as run_command
from repro.recipes import load_recipe
from repro.run.plan import SMOKE_STEPS


def add_arguments(parser):
    run_command.add_arguments(parser, default_steps=SMOKE_STEPS)


def run(args) -> int:
    if args.run_dir is None:
        args.run_dir = f"runs/{load_recipe(args.recipe or run_command.DEFAULT_RECIPE).name}-smoke"
    run_command.execute(args)
    return 0
