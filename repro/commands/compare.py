"""`repro compare SOURCE [SOURCE ...] [--out PATH] [--reference NAME]`: runs beside AMD's published numbers (or
another published DeepSeek-V4 RL run's, ``--reference``: repro/reference/), as a Markdown report.

A SOURCE is a repro run directory, a W&B CSV export (or a folder of them), a LumenRL log or a verl/LumenRL JSONL,
optionally written LABEL=KIND:PATH (repro/analysis/sources.py); several are compared side by side.
"""

from pathlib import Path

SOURCE_HELP = ("a repro run directory, W&B CSV export (or a folder / quoted glob of exports of one run), LumenRL log "
               "or verl/LumenRL JSONL; write LABEL=KIND:PATH to name it or its kind (run, wandb, lumenrl, verl)")


def add_source_arguments(parser):
    parser.add_argument("sources", metavar="SOURCE", nargs="+", help=SOURCE_HELP)
    parser.add_argument("--data-source", default=None,
                        help="the eval data source of val-core/<source>/acc/mean@k keys when a log has several")
    parser.add_argument("--wandb-run", default=None, help="the run to read from a W&B panel export holding several")


def add_arguments(parser):
    add_source_arguments(parser)
    parser.add_argument("--reference", default="amd",
                        help="the published run to compare with: amd (default), miles-mi355x, verl-veomni "
                             "(repro/reference/; docs/published-runs.md)")
    parser.add_argument("--out", type=Path, default=None,
                        help="report path (default: RUN_DIR/comparison.md for a repro run first, else "
                             "runs/compare/comparison.md)")


def run(args) -> int:
    from repro.analysis import caveats, load_sources, write_report
    from repro.analysis.compare import compare_to_amd
    from repro.analysis.compare_published import compare_to_published
    from repro.analysis.report import comparison_markdown, side_by_side_markdown
    from repro.analysis.sources import default_output_dir, describe
    from repro.reference import published_run

    reference = published_run(args.reference)  # an unknown name fails before anything is read
    sources = load_sources(args.sources, data_source=args.data_source, wandb_run=args.wandb_run)
    name = "comparison.md" if reference.name == "amd" else f"comparison-{reference.name}.md"
    path = write_report(sources, args.out or default_output_dir(sources) / name, reference.name)
    for frames in sources:
        print(describe(frames))
    print()
    if reference.name != "amd":
        for frames in sources:
            print(f"{frames.label} beside {reference.title}:")
            print(comparison_markdown(compare_to_published(frames, reference), reference.name))
            print()
        for note in reference.caveats:
            print(f"  - {note}")
        print(f"\nreport written to {path}")
        return 0
    print(comparison_markdown(compare_to_amd(sources[0])) if len(sources) == 1 else side_by_side_markdown(sources))
    for frames in sources:
        print(f"\n{frames.label}: where the numbers are not AMD's quantity")
        for note in caveats.source_notes(frames):
            print(f"  - {note}")
    print(f"\nreport written to {path}")
    return 0
