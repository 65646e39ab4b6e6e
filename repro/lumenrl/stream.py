"""LumenRL's console log into the run's ``metrics.jsonl`` while it is written, row by row, in our key names.

A LumenRL metrics line (``step=N k=v ...``, see repro/analysis/lumenrl_log.py) becomes the rows our own loop would
have written for that step: a ``kind: train`` row, and a ``kind: eval`` row when the line carries validation
(``val-core/...``, merged into the step line by LumenRL's DeepSeek-V4 trainer); an ``eval step=N ...`` line (its
EvalCallback, after the first update) becomes a ``kind: eval`` row at step N, with the step line's validation time
as the parser merges them. Lines are recognised and parsed
by the any-run parser's own pieces, and keys renamed by the importers' map (``throughput/gen_tok_per_s`` ->
``perf/rollout_tokens_per_s``, ``val-core/<source>/acc/mean@8`` -> ``eval/avg@8`` ...), so a run directory streamed
from LumenRL reads as ``read_lumenrl_log`` reads LumenRL's log file -- tests/test_lumenrl_stream.py holds them equal.

Only complete lines are read; a last line without its newline waits for the next poll, and at the end is a torn
line, dropped with a warning naming the file and line (as every reader here does). A line that starts as metrics
and breaks off mid-run is skipped with a warning naming the file and line: the run goes on, and reading the log
file afterwards reports it as the corruption it is.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Callable

from repro.analysis.frame import MetricsError, warn_torn_line
from repro.analysis.importers import EVAL_PREFIXES, SYNONYMS, canonical_columns
from repro.analysis.lumenrl_log import METRICS_START, parse_pairs
from repro.log_follow import LogFollower
from repro.metric_keys import ACCURACY, EVAL_SECONDS, KIND, SCORE, STEP
from repro.run.metrics_log import MetricsLog

EVAL_TIMING_KEYS = (EVAL_SECONDS, *SYNONYMS[EVAL_SECONDS])  # LumenRL's validation time, on every step line


class StreamWarning(UserWarning):
    """A line of LumenRL's log began as metrics but does not parse; it was skipped."""


def _is_eval_key(key: str) -> bool:
    return key.startswith(EVAL_PREFIXES) or key == EVAL_SECONDS


def rows_from_metrics(step: int, values: dict[str, float], source: Path, eval_line: bool = False,
                      origins: dict[str, str] | None = None) -> list[dict]:
    """One metrics line -> [train row] or [train row, eval row] (or [eval row] for an ``eval step=`` line).

    ``values`` are LumenRL's keys; the rows carry ours (the importers' map; ``reward/accuracy`` derived from the DAPO
    score as the importers derive it). Non-finite values become None, as our log writes them. ``origins`` collects
    our key -> LumenRL's key for every renamed key."""
    try:
        mapping = canonical_columns(list(values), None, source)
    except MetricsError:  # several validation data sources: keep each under its own name
        mapping = canonical_columns([k for k in values if not k.startswith("val-core/")], None, source)
    renamed = {mapping.get(k, k): (v if math.isfinite(v) else None) for k, v in values.items()}
    if origins is not None:
        origins.update({ours: theirs for theirs, ours in mapping.items()})
    if ACCURACY not in renamed and renamed.get(SCORE) is not None:
        renamed[ACCURACY] = (renamed[SCORE] + 1.0) / 2.0
        if origins is not None:
            origins[ACCURACY] = f"(1 + {origins.get(SCORE, SCORE)}) / 2"
    train = {k: v for k, v in renamed.items() if not _is_eval_key(k)}
    evals = {k: v for k, v in renamed.items() if _is_eval_key(k)}
    rows = [] if eval_line else [{KIND: "train", STEP: step, **train}]
    if any(v is not None for k, v in evals.items() if k != EVAL_SECONDS):  # LumenRL times validation on every row
        rows.append({KIND: "eval", STEP: step, **evals})
    return rows


class MetricsStream:
    """Follows LumenRL's log from ``offset`` and appends its rows to ``metrics``; ``progress(step, row)`` after each
    train row (notebook 03's live plot, the command line's bar)."""

    def __init__(self, log: Path, metrics: MetricsLog, progress: Callable[[int, dict], None], offset: int = 0,
                 origins_path: Path | None = None):
        self.follower = LogFollower(log, offset)
        self.metrics = metrics
        self.progress = progress
        self.origins_path = origins_path
        self.origins: dict[str, str] = (json.loads(origins_path.read_text())
                                        if origins_path and origins_path.is_file() else {})
        self.zero_based: bool | None = None  # decided by this attempt's first step line
        # decided by its first 'eval step=N' line: 0-based before LumenRL's fcbe86f (an 'eval step=0' shows it)
        self.eval_zero_based: bool | None = None
        self.step_timing: tuple[int, dict[str, float]] = (0, {})  # the last step line's validation time
        self.last_step = 0
        self.rows_written = 0
        self.skipped: list[int] = []

    def poll(self) -> int:
        """Read what was appended since the last poll; returns the rows written."""
        before = self.rows_written
        for number, line in self.follower.new_lines():
            for segment in line.split("\r"):  # a progress bar's carriage returns: segments of one line
                self._segment(number, segment)
        if self.rows_written != before:
            self._save_origins()
        return self.rows_written - before

    def finish(self) -> int:
        """After the process ended: read the rest; a last line without its newline is torn and dropped."""
        written = self.poll()
        tail = self.follower.pending.decode("utf-8", errors="replace")
        if tail.strip() and any(METRICS_START.search(s) for s in tail.split("\r")):
            warn_torn_line(self.follower.path, self.follower.line_number + 1, "no newline at the end of the log")
        return written

    def _segment(self, number: int, segment: str) -> None:
        match = METRICS_START.search(segment)
        if match is None:
            return
        values, error = parse_pairs(segment[match.end():])
        if error is not None:
            if values:  # began as metrics and broke off: another process' output spliced in, say
                self.skipped.append(number)
                warnings.warn(f"{self.follower.path}:{number}: LumenRL metrics line does not parse ({error}); "
                              "skipped", StreamWarning, stacklevel=2)
            return
        step, eval_line = int(match["step"]), bool(match["eval"])
        if eval_line:
            if self.eval_zero_based is None:  # as the parser decides it (repro.analysis.lumenrl_log)
                self.eval_zero_based = bool(self.zero_based) or step == 0
            step += int(self.eval_zero_based)
            if self.step_timing[0] == step:  # the parser merges a step's lines into one row: the same timing
                values = {**self.step_timing[1], **values}
        else:
            if self.zero_based is None:
                self.zero_based = step == 0  # LumenRL before its 1-based logging
            step += int(self.zero_based)
            self.step_timing = (step, {k: v for k, v in values.items() if k in EVAL_TIMING_KEYS})
        for row in rows_from_metrics(step, values, self.follower.path, eval_line, self.origins):
            self.metrics.append(row)
            self.rows_written += 1
            if row[KIND] == "train":
                self.last_step = step
                self.progress(step, row)

    def _save_origins(self) -> None:
        if self.origins_path is not None:
            tmp = self.origins_path.with_name(f".{self.origins_path.name}.tmp")
            tmp.write_text(json.dumps(self.origins, indent=1, sort_keys=True))
            tmp.replace(self.origins_path)
