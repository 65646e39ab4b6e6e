"""`repro figures RUN_DIR [--out DIR]`: regenerate AMD's four charts from a run's log (PNG + SVG)."""

from pathlib import Path


def add_arguments(parser):
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory holding metrics.jsonl and recipe.yaml")
    parser.add_argument("--out", type=Path, default=Path("figures"), help="output folder (default: figures/)")


def run(args) -> int:
    from repro.plots import make_all_figures

    for path in make_all_figures(args.run_dir, args.out):
        print(path)
    return 0
