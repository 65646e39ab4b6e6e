"""Analysis of a run's metrics log: frames, AMD comparison, importers for W&B/verl exports (figures: repro.plots)."""

from repro.analysis.compare import compare_to_amd, write_report
from repro.analysis.frame import MetricsError, RunFrames, load_run
from repro.analysis.importers import read_verl_jsonl, read_wandb_csv

__all__ = ["MetricsError", "RunFrames", "compare_to_amd", "load_run", "read_verl_jsonl", "read_wandb_csv", "write_report"]
