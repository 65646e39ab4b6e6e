"""Analysis of run logs: frames, sources (repro runs, W&B exports, LumenRL logs, verl JSONL), comparison with AMD
and its report (figures: plots.py)."""

from repro.analysis.compare import compare_sources, compare_to_amd
from repro.analysis.frame import MetricsError, RunFrames, load_run
from repro.analysis.importers import read_verl_jsonl, read_wandb_csv
from repro.analysis.lumenrl_log import read_lumenrl_log
from repro.analysis.report import write_report
from repro.analysis.sources import load_source, load_sources

__all__ = ["MetricsError", "RunFrames", "compare_sources", "compare_to_amd", "load_run", "load_source", "load_sources",
           "read_lumenrl_log", "read_verl_jsonl", "read_wandb_csv", "write_report"]
