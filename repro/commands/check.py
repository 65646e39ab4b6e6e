"""`repro check --recipe NAME [--json PATH]`: is this machine / Ray cluster ready for the recipe?

Prints one row per check (PASS / WARN / FAIL / SKIP, the reason, and the fix for WARN/FAIL); ``--json``
writes the same rows as a list of {check, status, detail, fix}. Exit code 0 if nothing FAILs, 1 otherwise.
"""

from __future__ import annotations

from repro.readiness.checks import check_cluster, failed, format_table, summary_line, write_json
from repro.recipes import list_recipes, load_recipe


def add_arguments(parser):
    parser.add_argument("--recipe", default="tiny-cpu",
                        help=f"committed recipe ({', '.join(list_recipes())}) or YAML path")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a recipe field (repeatable), e.g. cluster.ray_address=10.0.0.1:6379")
    parser.add_argument("--run-dir", help="where checkpoints will go, for the disk check (default: runs/<recipe name>)")
    parser.add_argument("--start-ray", action="store_true",
                        help="cluster.ray_address null (the tiny recipe): really start and stop a local Ray instance")
    parser.add_argument("--json", dest="json_path", metavar="PATH", help="also write the results as JSON here")


def run(args) -> int:
    recipe = load_recipe(args.recipe, args.overrides)
    results = check_cluster(recipe, args.run_dir, start_local_ray=args.start_ray)
    print(summary_line(recipe, results))
    print(format_table(results))
    if args.json_path:
        print(f"results written to {write_json(results, args.json_path)}")
    return 1 if failed(results) else 0
