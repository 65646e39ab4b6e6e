"""What a metrics row must be before any of it is used: a JSON object, a whole step number in range, numbers.

The run's own ``metrics.jsonl`` (read at every resume and by every reader) and imported logs (verl/LumenRL JSONL,
W&B CSV) pass the same checks, each failure named ``file:line: key``:

- a step is a whole number from 0 to MAX_STEP (``1.5``, ``1e20``, ``-1``, ``"3"`` are refused: read as they were,
  they became step 1 and -9223372036854775808);
- a value is a number or null; the run's own rows may also carry a list of numbers under LIST_KEYS and text in
  the rows that are not a step's result (``restart``, ``resume``); anything else (a string, a list, an object)
  is refused;
- a value that is NaN or infinite is no measurement: readers leave it out of every mean and say so, one note per
  value ("step 4: reward/accuracy is inf; left out"); the run itself logs such values as null.
"""

from __future__ import annotations

import math

from repro.errors import ReproError

MAX_STEP = 10**9  # no RL run takes a billion optimizer steps: a larger step is a corrupt or mistyped value
LIST_KEYS = frozenset({"eval/correct_counts"})  # the run's own list-valued key: correct samples per problem
RESULT_KINDS = ("train", "eval")  # rows that are a step's result; others (restart, resume) record events


class RowError(ReproError, ValueError):
    """A metrics row is not an object, has no valid step, or holds a value that is not a number."""


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def step_number(value, where: str) -> int:
    """``value`` as a step, or RowError naming ``where`` (``file:line: step``)."""
    if not is_number(value):
        raise RowError(f"{where} holds {_shown(value)}, not a step number")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise RowError(f"{where} holds {_shown(value)}, not a whole step number")
    if not 0 <= value <= MAX_STEP:
        raise RowError(f"{where} holds {_shown(value)}, outside 0..{MAX_STEP}")
    return int(value)


def non_finite(value) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def check_own_row(row, where: str) -> dict:
    """A row of the run's own metrics.jsonl (``where``: ``file:line``): an object with a step; a result row's
    values are numbers, nulls or (LIST_KEYS) lists of numbers. Returns the row."""
    if not isinstance(row, dict):
        raise RowError(f"{where}: expected a JSON object, got {type(row).__name__} {_shown(row)}")
    if "step" not in row:
        raise RowError(f"{where}: step: missing (every row names its step)")
    step_number(row["step"], f"{where}: step")
    kind = row.get("kind", "train")
    if not isinstance(kind, str):
        raise RowError(f"{where}: kind holds {_shown(kind)}, not a row kind")
    if kind in RESULT_KINDS:
        for key, value in row.items():
            if key in ("kind", "step") or value is None or is_number(value):
                continue
            if key in LIST_KEYS and isinstance(value, list) and all(is_number(v) for v in value):
                continue
            raise RowError(f"{where}: {key} holds {_shown(value)}, not a number")
    return row


def check_imported_row(row: dict, where: str, step_keys: tuple[str, ...]) -> dict:
    """A row of another framework's log: every step key present a valid step, every other value a number or
    null. Returns the row."""
    for key, value in row.items():
        if value is None:
            continue
        if key in step_keys:
            step_number(value, f"{where}: {key}")
        elif not is_number(value):
            raise RowError(f"{where}: {key} holds {_shown(value)}, not a number")
    return row


def left_out(step, key: str, value) -> str:
    """The note for a non-finite value a reader leaves out."""
    shown = "NaN" if isinstance(value, float) and math.isnan(value) else repr(value)
    return f"step {step}: {key} is {shown}; left out"
