"""Analysis of a run's metrics log: frames, AMD comparison, importers for W&B/verl exports (figures: repro.plots)."""

from repro.analysis.compare import compare_to_amd, write_report
from repro.analysis.frame import MetricsError, RunFrames, load_run

__all__ = ["MetricsError", "RunFrames", "compare_to_amd", "load_run", "write_report"]
