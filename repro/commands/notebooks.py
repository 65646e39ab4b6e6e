"""`repro notebooks [--recipe R] [--run-dir DIR] [--steps N]`: the notebook chain 00 -> 20 with papermill.

Executed notebooks (and each one's recorded results JSON) go to RUN_DIR/notebooks/, figures (PNG + SVG) to
--figures, the comparison report to RUN_DIR/comparison.md and, last, the report page to RUN_DIR/report/index.html
(as `repro report RUN_DIR` writes it). A failing notebook stops the chain naming the
notebook and the cell; its executed copy holds the traceback.
"""

from __future__ import annotations

from pathlib import Path

from repro.notebooks import CHAIN, run_chain
from repro.run.folder import DELETE_RUN, clear_for_fresh, plan_fresh, run_dir_lock


def add_arguments(parser):
    parser.add_argument("--recipe", default="tiny-cpu", help="recipe to run (default tiny-cpu)")
    parser.add_argument("--run-dir", default="runs/tiny-cpu", help="run directory (resumed if it holds a run)")
    parser.add_argument("--steps", type=int, default=None,
                        help="optimizer steps of the full run (default: the recipe's)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a recipe field for the smoke and full runs (repeatable)")
    parser.add_argument("--figures", type=Path, default=Path("figures"), help="figure folder (default: figures/)")
    parser.add_argument("--in-process", action="store_true",
                        help="trainer and rollout inside the notebook kernel instead of Ray actors")
    parser.add_argument("--only", action="append", choices=CHAIN, metavar="NOTEBOOK",
                        help=f"run only these notebooks (repeatable; chain: {', '.join(CHAIN)})")
    parser.add_argument("--skip", action="append", default=[], choices=CHAIN, metavar="NOTEBOOK",
                        help="leave a notebook out (repeatable)")
    parser.add_argument("--parallel", type=int, default=2, metavar="N",
                        help="notebooks of one wave run N at a time (00+01, then 10-20; the runs alone); 1: in order")
    parser.add_argument("--fresh", nargs="?", const=True, default=False, choices=(True, DELETE_RUN), metavar="WORD",
                        help="start the run directory over: --fresh removes a smoke run's files only (a run of at "
                             f"most 3 steps); --fresh {DELETE_RUN} removes a longer run's. Says what it removes "
                             "first; files that are not the run's stay")


def run(args) -> int:
    run_dir = Path(args.run_dir)
    if args.fresh:
        plan_fresh(run_dir, args.fresh)  # refused before the lock file is made in a folder that is not a run's
        with run_dir_lock(run_dir):  # not while a run uses the folder
            clear_for_fresh(run_dir, args.fresh)
    result = run_chain(run_dir, args.recipe, args.steps, overrides=args.overrides, in_process=args.in_process,
                       figures_dir=args.figures, notebooks=args.only, skip=args.skip,
                       parallel=args.parallel)
    print()
    print(result.describe())
    return 0
