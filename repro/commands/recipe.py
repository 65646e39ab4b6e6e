"""`repro recipe NAME [--set field=value ...]`: validate a recipe and print it with every default resolved."""

import sys

import yaml

from repro.recipes import list_recipes, load_recipe


def add_arguments(parser):
    parser.add_argument("recipe", nargs="?", help=f"committed name ({', '.join(list_recipes())}) or a YAML path")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a field, e.g. --set steps=3 (repeatable)")
    parser.add_argument("--list", action="store_true", help="list committed recipes and exit")


def run(args) -> int:
    if args.list or not args.recipe:
        print("\n".join(list_recipes()))
        return 0
    recipe = load_recipe(args.recipe, args.overrides)
    yaml.safe_dump(recipe.model_dump(mode="json"), sys.stdout, sort_keys=False)
    print(f"# valid: {recipe.trajectories_per_step} trajectories/step, actor DP={recipe.data_parallel}",
          file=sys.stderr)
    return 0
