"""verl's metrics into the run's ``metrics.jsonl`` while verl trains, row by row, in our key names.

The source is verl's file logger (``Tracking`` backend ``file``: one ``{"step": N, "data": {...}}`` line per
``logger.log`` call, NaN written as null), at the path we give each attempt (``$VERL_FILE_LOGGER_PATH``): verl opens
it with ``"wb"``, truncating it at every start, so each attempt gets a fresh file and nothing an earlier attempt
logged is lost. Where that file never appears (``file`` dropped from ``trainer.logger`` by an override), the
console logger's lines are the fallback: ``step:N - key:value - ...`` with numpy reprs (``np.float64(0.5)``), behind
Ray's ``(TaskRunner pid=...)`` prefix and ANSI colours. Keys are renamed by the importers' map, so a streamed run
reads as ``read_verl_jsonl`` reads the finished file (tests/verl holds them equal). Validation keys
(``val-core/...``, ``val-aux/...``) make the step's ``eval`` row; ``val_before_train`` logs them alone at step 0.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path
from typing import Any, Callable

from repro.analysis.frame import MetricsError, warn_torn_line
from repro.analysis.importers import EVAL_PREFIXES, canonical_columns
from repro.log_follow import LogFollower
from repro.metric_keys import ACCURACY, EVAL_SECONDS, KIND, SCORE, STEP
from repro.run.metrics_log import MetricsLog

ANSI = re.compile(r"\x1b\[[0-9;]*m")
CONSOLE_STEP = re.compile(r"(?:^|\s)step:(?P<step>\d+)(?P<rest>(?: - [^\s:][^:]*:\S+)*)\s*$")
NUMPY_REPR = re.compile(r"^np\.[a-z_0-9]+\((?P<value>.*)\)$")


class StreamWarning(UserWarning):
    """A line of verl's log began as metrics but does not parse; it was skipped."""


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    return None


def rows_from_record(step: int, data: dict[str, Any], source: Path, origins: dict[str, str]) -> list[dict]:
    """One logged step -> [train row], [eval row] (validation alone, e.g. before training) or both, in our keys."""
    values = {k: _number(v) for k, v in data.items() if v is None or _number(v) is not None}
    try:
        mapping = canonical_columns(list(values), None, source)
    except MetricsError:  # several validation data sources: keep each under its own name
        mapping = canonical_columns([k for k in values if not k.startswith("val-core/")], None, source)
    renamed = {mapping.get(k, k): v for k, v in values.items()}
    origins.update({ours: theirs for theirs, ours in mapping.items()})
    if ACCURACY not in renamed and renamed.get(SCORE) is not None:
        renamed[ACCURACY] = (renamed[SCORE] + 1.0) / 2.0
        origins[ACCURACY] = f"(1 + {origins.get(SCORE, SCORE)}) / 2"
    evals = {k: v for k, v in renamed.items() if k.startswith(EVAL_PREFIXES) or k == EVAL_SECONDS}
    train = {k: v for k, v in renamed.items() if k not in evals}
    rows = [{KIND: "train", STEP: step, **train}] if any(v is not None for v in train.values()) else []
    if any(v is not None for k, v in evals.items() if k != EVAL_SECONDS):
        rows.append({KIND: "eval", STEP: step, **evals})
    return rows


def parse_console_line(line: str) -> tuple[int, dict[str, float | None]] | None:
    """A console logger line -> (step, values), or None when the line is not one."""
    match = CONSOLE_STEP.search(ANSI.sub("", line))
    if match is None:
        return None
    values: dict[str, float | None] = {}
    for pair in match["rest"].split(" - ")[1:]:
        key, _, text = pair.rpartition(":")
        inner = NUMPY_REPR.match(text)
        text = inner["value"] if inner else text
        number = {"True": 1.0, "False": 0.0}.get(text)
        values[key] = number if number is not None else _number(float(text))
    return int(match["step"]), values


class VerlStream:
    """Follows one attempt's JSONL (or, without it, the console log from ``console_offset``) and appends its rows
    to ``metrics``; ``progress(step, row)`` after each train row."""

    def __init__(self, jsonl: Path, console: Path, metrics: MetricsLog, progress: Callable[[int, dict], None],
                 console_offset: int = 0, origins_path: Path | None = None):
        self.jsonl, self.console = LogFollower(jsonl), LogFollower(console, console_offset)
        self.metrics, self.progress, self.origins_path = metrics, progress, origins_path
        self.origins: dict[str, str] = (json.loads(origins_path.read_text())
                                        if origins_path and origins_path.is_file() else {})
        self.source: str | None = None  # "file" or "console", fixed by what appears first
        self.last_step, self.rows_written, self.skipped = 0, 0, []

    def poll(self) -> int:
        before = self.rows_written
        if self.source in (None, "file") and self.jsonl.path.is_file():
            self.source = "file"
            for number, line in self.jsonl.new_lines():
                self._json_line(number, line)
        if self.source in (None, "console"):
            for number, line in self.console.new_lines():
                parsed = parse_console_line(line) if self.source or not self.jsonl.path.is_file() else None
                if parsed is not None:
                    self.source = "console"
                    self._append(*parsed)
        if self.rows_written != before and self.origins_path is not None:
            tmp = self.origins_path.with_name(f".{self.origins_path.name}.tmp")
            tmp.write_text(json.dumps(self.origins, indent=1, sort_keys=True))
            tmp.replace(self.origins_path)
        return self.rows_written - before

    def finish(self) -> int:
        """After verl ended: the rest; a last JSONL line without its newline is torn, dropped with a warning."""
        written = self.poll()
        if self.source == "file" and self.jsonl.pending.strip():
            warn_torn_line(self.jsonl.path, self.jsonl.line_number + 1, "no newline at the end of verl's file")
        return written

    def _json_line(self, number: int, line: str) -> None:
        if not line.strip():
            return
        try:
            record = json.loads(line)
            step, data = int(record["step"]), record["data"]
            if not isinstance(data, dict):
                raise TypeError("data is not a mapping")
        except (ValueError, KeyError, TypeError) as err:
            self.skipped.append(number)
            warnings.warn(f"{self.jsonl.path}:{number}: not a verl file-logger record ({err}); skipped",
                          StreamWarning, stacklevel=2)
            return
        self._append(step, data)

    def _append(self, step: int, data: dict) -> None:
        for row in rows_from_record(step, data, self.jsonl.path, self.origins):
            self.metrics.append(row)
            self.rows_written += 1
            if row[KIND] == "train":
                self.last_step = step
                self.progress(step, row)
