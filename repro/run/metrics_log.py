"""The per-run metrics log: one JSON object per line, appended and flushed as each step ends.

Rows carry ``kind`` ("train", "eval", or "restart": a worker died and the run restarted its groups) and ``step``.
Keys follow verl/LumenRL names (``rollout_corr/kl``, ``actor/grad_norm``, ``timing_s/step`` ...) so other
frameworks' exports line up with ours.

An append either adds the whole line or leaves the file as it was: a write that fails part-way (disk full, file
size limit) is cut back to the previous end, so a later reader never meets a torn row in the middle of the log.
The log is never opened through a link (repro.owned), and reading it checks every row (repro.metric_rows: an
object, a whole step in range, numbers), so a resume refuses a corrupt log naming ``file:line: key``.

This is the one place rows are written: each appended row then goes to the log's sinks (TensorBoard, W&B:
``repro.run.sinks``), so those records hold what this file holds.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from repro.errors import ReproError, TornLineWarning
from repro.metric_rows import check_own_row
from repro.owned import open_no_follow, write_atomic

if TYPE_CHECKING:
    from repro.run.sinks import Sink


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; a missing value reads back as NaN in pandas
    return value


class MetricsLog:
    def __init__(self, path: str | Path, sinks: "list[Sink] | None" = None):
        self.path = Path(path)
        self.sinks = list(sinks or [])

    def append(self, row: dict) -> None:
        row_cleaned = {k: _clean(v) for k, v in row.items()}
        data = (json.dumps(row_cleaned, sort_keys=False) + "\n").encode()
        try:
            fd = open_no_follow(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        except OSError as err:
            raise self._not_written(row, err) from None
        try:
            end = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except OSError as err:
                os.ftruncate(fd, end)  # frees space, so it succeeds on a full disk too
                raise self._not_written(row, err) from None
        finally:
            os.close(fd)
        for sink in self.sinks:
            sink.log(row_cleaned)

    def _not_written(self, row: dict, err: OSError) -> ReproError:
        what = f"the {row.get('kind', 'train')} row of step {row.get('step', '?')}"
        return ReproError(f"{self.path}: could not append {what} ({err.strerror or err}); the log is left as it was, "
                          "ending at its previous complete row")

    def close(self, exit_code: int = 0) -> None:
        """End every sink (W&B marks its run finished, or failed with a non-zero ``exit_code``)."""
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close(exit_code)

    def rows(self) -> list[dict]:
        """All complete rows, each checked (repro.metric_rows); a torn last line (killed mid-write) is ignored."""
        if not self.path.exists():
            return []
        out = []
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as err:
            raise ReproError(f"{self.path}: not text (byte {err.start} is not UTF-8): not a metrics log") from None
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                if number == len(lines):  # killed mid-write: the only line that can be torn
                    warnings.warn(f"{self.path}:{number}: torn last line dropped (the run was stopped mid-write)",
                                  TornLineWarning, stacklevel=2)
                    break
                raise ReproError(f"{self.path}:{number}: not a JSON row (the log is corrupt before its end)") from None
            out.append(check_own_row(row, f"{self.path}:{number}"))  # RowError names file:line: key
        return out

    def truncate_after(self, step: int) -> int:
        """Keep rows up to ``step`` (resume from a checkpoint at ``step``); returns how many were dropped."""
        rows = self.rows()
        kept = [r for r in rows if r["step"] <= step]
        write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        return len(rows) - len(kept)

    def write_parquet(self, path: str | Path | None = None) -> Path:
        import pandas as pd

        final = Path(path) if path else self.path.with_suffix(".parquet")
        tmp = final.with_name(final.name + ".tmp")
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()  # a link is removed itself, never written through
        pd.DataFrame(self.rows()).to_parquet(tmp, index=False)
        tmp.replace(final)
        return final
