"""`repro report SOURCE [SOURCE ...] [--out DIR] [--reference NAME]`: one page for a run, or several side by side:
DIR/index.html with the comparison with AMD (or another published run, ``--reference``), the four figures and the
caveats inside it, the executed notebooks as HTML beside it, and links to the raw records (sources as in
`repro compare`). DIR defaults to RUN_DIR/report for a repro run first, else runs/compare/report."""

import time
from pathlib import Path

from repro.commands.compare import add_source_arguments


def add_arguments(parser):
    add_source_arguments(parser)
    parser.add_argument("--reference", default="amd",
                        help="the published run the tables set the sources beside: amd (default), miles-mi355x, "
                             "verl-veomni (repro/reference/)")
    parser.add_argument("--out", type=Path, default=None,
                        help="report folder (default: RUN_DIR/report for a repro run first, else runs/compare/report)")


def run(args) -> int:
    from repro.report_page import write_report_page

    started = time.perf_counter()
    page = write_report_page(args.sources, args.out, reference=args.reference, data_source=args.data_source,
                             wandb_run=args.wandb_run)
    print(f"report written to {page} in {time.perf_counter() - started:.1f} s")
    return 0
