"""`repro figures SOURCE [SOURCE ...] [--out DIR]`: AMD's four charts from one or more runs' logs (PNG + SVG),
several sources overlaid (sources as in `repro compare`)."""

from pathlib import Path

from repro.commands.compare import add_source_arguments


def add_arguments(parser):
    add_source_arguments(parser)
    parser.add_argument("--out", type=Path, default=Path("figures"), help="output folder (default: figures/)")


def run(args) -> int:
    from repro.analysis.plots import make_all_figures

    for path in make_all_figures(args.sources, args.out, data_source=args.data_source, wandb_run=args.wandb_run):
        print(path)
    return 0
