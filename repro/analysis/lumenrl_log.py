"""LumenRL's console log (what its ``LoggingCallback`` writes through Python logging) into RunFrames.

What LumenRL writes, read in its source (``lumenrl/trainer/callbacks.py``, ``trainer/main.py``, ``rl_trainer.py``):

- one INFO record per step, message ``step=N k=v k=v ...``: keys sorted, values ``%.6g`` (so ``nan``, ``inf``,
  ``1e-06`` occur); N is 1-based since 815a0ef (2026-06-25; ``LoggingCallback``, callbacks.py:52 at 2232f55),
  0-based before (a ``step=0`` line gives those logs away; they are shifted by one, with a note);
- the record carries the logging prefix ``%(asctime)s [%(levelname)s] %(name)s: `` and, from a Ray worker, Ray's
  ``(Actor pid=...)`` prefix; other messages that mention a step (``[eval] step=5 acc=...``, ``ENT_DIAG step=0
  ...``, ``Saving checkpoint step=25: ...``) are not metrics and are skipped, because the message itself must start
  with ``step=``;
- the DSV4 trainer validates after every ``val_steps``-th update (1-based step 5, 10, ... for ``val_steps: 5``;
  rl_trainer.py:4164) and merges ``val-core/...`` into that step's line; ``eval.enabled`` installs an
  ``EvalCallback`` (main.py:115-116) that validates after 0-based steps 0, interval, 2 x interval ... (interval
  default 1000: in practice once, after the first update) and logs ``eval step=N ...`` on a line of its own. N is
  ``step + 1`` since fcbe86f (2026-07-08; callbacks.py:277), the same 1-based count as the step lines and as the
  W&B row the values land in (callbacks.py:387-389), so it is read as it stands. Between 815a0ef and fcbe86f the
  eval line still carried the 0-based step under 1-based step lines; such a log shows itself by an ``eval step=0``
  line (the first evaluation, after the first update), and its eval lines are shifted by one, with a note. A
  0-based log's eval lines are 0-based too and are shifted with its step lines.

A line that starts like a metrics line but does not parse is corruption, named by file and line; as the last line of
the file it is a write cut short and is dropped with a warning. Keys map to ours as in repro.analysis.importers.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from repro.analysis.frame import MAX_NOTES, MetricsError, RunFrames, warn_torn_line
from repro.metric_rows import RowError, left_out, non_finite, step_number
from repro.analysis.importers import frames_from_table

# The message starts at the line start or right after the logging prefix's "name: ".
METRICS_START = re.compile(r"(?:^|: )(?P<eval>eval )?step=(?P<step>\d+)(?= |$)")
PAIR = re.compile(r"^(?P<key>[^\s=]+)=(?P<value>\S+)$")


def parse_pairs(text: str) -> tuple[dict[str, float], str | None]:
    """``k=v k=v`` -> ({k: float(v)}, None), or (the pairs before it, why) at the first token that is not a
    number pair."""
    values: dict[str, float] = {}
    for token in text.split():
        match = PAIR.match(token)
        if match is None:
            return values, f"{token!r} is not key=value"
        try:
            values[match["key"]] = float(match["value"])
        except ValueError:
            return values, f"{match['key']}={match['value']!r} is not a number"
    return values, None if values else "no key=value pairs after the step"


def is_lumenrl_log(text: str) -> bool:
    """Whether some line of ``text`` is a whole LumenRL metrics line (what source detection asks)."""
    return any((m := METRICS_START.search(line)) and parse_pairs(line[m.end():])[1] is None
               for line in text.splitlines())


def read_lumenrl_log(path: str | Path, data_source: str | None = None, label: str = "") -> RunFrames:
    """The metrics lines of a LumenRL console log (any other output in between is skipped)."""
    path = Path(path)
    if not path.is_file():
        raise MetricsError(f"{path}: LumenRL log not found")
    try:
        # Physical lines, as an editor numbers them: a progress bar's carriage return splits a line into segments
        # without starting a new one.
        lines = [line.rstrip("\r") for line in path.read_text(encoding="utf-8", errors="strict").split("\n")]
    except UnicodeDecodeError as err:
        raise MetricsError(f"{path}: not a text log ({err})") from None
    last = max((i for i, line in enumerate(lines, start=1) if line.strip()), default=0)
    rows, zero_based, eval_zero = [], False, False
    segments = ((number, segment, number == last and k == line.count("\r"))
                for number, line in enumerate(lines, start=1) for k, segment in enumerate(line.split("\r")))
    for number, segment, at_end in segments:
        match = METRICS_START.search(segment)
        if match is None:
            continue
        values, error = parse_pairs(segment[match.end():])
        if error is not None:
            if at_end:
                warn_torn_line(path, number, error)
                break
            if values:  # it began as metrics and broke off: corruption, not a message that mentions a step
                raise MetricsError(f"{path}:{number}: LumenRL metrics line does not parse: {error}")
            continue
        try:
            step = step_number(int(match["step"]), f"{path}:{number}: step")
        except RowError as err:
            raise MetricsError(str(err)) from None
        if match["eval"]:
            eval_zero |= step == 0
        else:
            zero_based |= step == 0
        rows.append({"step": step, "_eval_line": bool(match["eval"]), **values})
    if not rows:
        raise MetricsError(f"{path}: no LumenRL metrics lines ('step=N key=value ...') in the log")
    table = pd.DataFrame(rows)
    eval_lines = table["_eval_line"]
    shift_evals = zero_based or eval_zero
    if zero_based:
        table.loc[~eval_lines, "step"] += 1
    if shift_evals:
        table.loc[eval_lines, "step"] += 1
    table = table.drop(columns="_eval_line")
    notes = [left_out(int(step), key, value) for key in table.columns if key != "step"
             for step, value in zip(table["step"], table[key]) if non_finite(value)]
    if len(notes) > MAX_NOTES:
        notes = notes[:MAX_NOTES] + [f"{len(notes) - MAX_NOTES} more non-finite values left out"]
    table = table.replace([math.inf, -math.inf], math.nan)  # left out of every mean, named in the notes
    if zero_based:
        notes.append("The log counts training steps from 0 (LumenRL before its 1-based logging); shifted by one so "
                     "step N is the state after N updates")
    if shift_evals and eval_lines.any():
        notes.append(f"The {int(eval_lines.sum())} 'eval step=N' lines carry a 0-based N (LumenRL before fcbe86f): "
                     "shown at step N + 1, the number of updates before that evaluation")
    if eval_lines.any():
        notes.append("LumenRL's EvalCallback evaluates after the step's timings were taken (rl_trainer.py:4169-4179, "
                     "callbacks at :4188-4189): the time of its evaluations ('eval step=N' lines) is in no timing key")
    return frames_from_table(table, path, data_source, kind="lumenrl", label=label, notes=notes)
