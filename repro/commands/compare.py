"""`repro compare RUN_DIR [--out PATH]`: this run beside AMD's published numbers, as a Markdown report."""

from pathlib import Path


def add_arguments(parser):
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory holding metrics.jsonl and recipe.yaml")
    parser.add_argument("--out", type=Path, default=None, help="report path (default: RUN_DIR/comparison.md)")


def run(args) -> int:
    from repro.analysis import compare_to_amd, load_run, write_report
    from repro.analysis.compare import comparison_markdown

    frames = load_run(args.run_dir)
    path = write_report(frames, args.out or Path(args.run_dir) / "comparison.md")
    print(comparison_markdown(compare_to_amd(frames)))
    print(f"\nreport written to {path}")
    return 0
