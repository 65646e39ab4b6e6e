"""The complete lines a growing log file gained since we last looked: what an engine's log stream reads while the
engine writes (``repro.lumenrl.stream`` follows LumenRL's console log, ``repro.verl.stream`` verl's JSONL file).

A last line without its newline is held back until the writer finishes it; the caller decides, at the end, whether
what is left is a torn line.
"""

from __future__ import annotations

from pathlib import Path


class LogFollower:
    """The complete lines appended to a file since ``offset``, with their line numbers in the whole file."""

    def __init__(self, path: Path, offset: int = 0):
        self.path = Path(path)
        self.offset = offset
        self.pending = b""
        self.line_number = self._lines_before(offset)

    def _lines_before(self, offset: int) -> int:
        if offset == 0 or not self.path.is_file():
            return 0
        with open(self.path, "rb") as handle:
            return handle.read(offset).count(b"\n")

    def new_lines(self) -> list[tuple[int, str]]:
        if not self.path.is_file():
            return []
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read()
        self.offset += len(chunk)
        *complete, self.pending = (self.pending + chunk).split(b"\n")
        out = []
        for raw in complete:
            self.line_number += 1
            out.append((self.line_number, raw.decode("utf-8", errors="replace").rstrip("\r")))
        return out
