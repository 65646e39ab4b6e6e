"""Read DAPO-Math-17K and AIME-2024 from local parquet/jsonl files into ``MathProblem`` records.

Two row layouts are understood:

* ``dapo`` (verl's RL layout, used by DAPO-Math-17K and the 960-row 30x32 AIME-2024 repeat):
  ``data_source`` str, ``prompt`` list of ``{role, content}``, ``ability``, ``reward_model`` with
  ``ground_truth`` (and ``style``), ``extra_info`` mapping (``index`` becomes the uid).
* ``simple`` (the 30-row AIME-2024 releases): ``problem``/``answer`` or ``Problem``/``Answer``, the answer
  a string or an integer.

Rows repeat in both DAPO releases (~1.79M rows hold ~17.9K problems; 960 rows hold 30), so loading
de-duplicates by bare problem text, keeping the first row. Malformed rows are skipped and counted, or raise
``DataError`` naming file, row and field, as ``on_malformed`` says. Nothing is fetched from a hub and
nothing is unpickled: parquet goes through pyarrow, jsonl through ``json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal, Sequence

from repro.data.records import DAPO_PROMPT_TEMPLATE, ChatMessage, MathProblem, strip_template
from repro.errors import DataError, RecipeError

OnMalformed = Literal["skip", "fail"]
MALFORMED_POLICIES = ("skip", "fail")
LAYOUTS = ("auto", "dapo", "simple")
MAX_REPORTED_MALFORMED = 5
PARQUET_BATCH_ROWS = 4096  # streamed, so the 1.79M-row release never sits in memory as Python objects


@dataclass(frozen=True)
class MalformedRow:
    file: str
    row: int
    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.file}: row {self.row}: field '{self.field}' {self.reason}"


@dataclass(frozen=True)
class LoadStats:
    """What a load did. ``answer_conflicts`` counts dropped duplicates whose answer differed from the kept."""

    file: str
    layout: str
    rows_read: int
    kept: int
    duplicates_dropped: int
    answer_conflicts: int
    malformed_skipped: int
    first_malformed: tuple[MalformedRow, ...]

    def summary(self) -> str:
        return (
            f"{self.file} ({self.layout} layout): {self.rows_read} rows read, {self.kept} problems kept, "
            f"{self.duplicates_dropped} duplicates dropped ({self.answer_conflicts} with a different answer), "
            f"{self.malformed_skipped} malformed rows skipped"
        )


@dataclass(frozen=True)
class LoadedProblems:
    problems: tuple[MathProblem, ...]
    stats: LoadStats


class _Malformed(Exception):
    def __init__(self, field: str, reason: str):
        super().__init__(field, reason)
        self.field, self.reason = field, reason


def _iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    with path.open("rb") as handle:
        for index, raw in enumerate(handle):
            if not raw.strip():
                continue
            try:
                yield index, json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as error:
                yield index, _Malformed("<row>", f"is not valid UTF-8 JSON ({error.__class__.__name__}: {error})")


def _iter_parquet(path: Path) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq  # lazy: CLI start-up should not pay for pyarrow

    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=PARQUET_BATCH_ROWS)
        index = 0
        for batch in batches:
            for row in batch.to_pylist():
                yield index, row
                index += 1
    except (OSError, ValueError) as error:  # pyarrow's ArrowIOError / ArrowInvalid
        raise DataError(f"{path}: not a readable parquet file ({error})") from error


def iter_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """(row index, row) for every row; a row that cannot be decoded comes back as a ``_Malformed``."""
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if path.suffix == ".parquet":
        return _iter_parquet(path)
    if path.suffix in (".jsonl", ".json"):
        return _iter_jsonl(path)
    raise DataError(f"{path}: unknown dataset format {path.suffix!r}; expected .parquet or .jsonl")


def _detect_layout(row: Any) -> str | None:
    if not isinstance(row, dict):
        return None
    if "prompt" in row or "reward_model" in row:
        return "dapo"
    if any(key in row for key in ("problem", "Problem", "answer", "Answer")):
        return "simple"
    return None


def _answer_text(value: Any, field: str) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # pandas turns an integer column with gaps into floats
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _Malformed(field, f"must be a string or an integer, got {type(value).__name__}")
    text = str(value).strip()
    if not text:
        raise _Malformed(field, "is empty")
    return text


def _parse_dapo_row(row: dict, uid_fallback: str, templates: Sequence[str]) -> MathProblem:
    for column in ("data_source", "prompt", "reward_model"):
        if row.get(column) is None:
            raise _Malformed(column, "is missing")
    if not isinstance(row["data_source"], str):
        raise _Malformed("data_source", f"must be a string, got {type(row['data_source']).__name__}")
    if not isinstance(row["prompt"], (list, tuple)) or not row["prompt"]:
        raise _Malformed("prompt", "must be a non-empty list of {role, content} messages")
    messages = []
    for position, message in enumerate(row["prompt"]):
        is_message = isinstance(message, dict) and all(isinstance(message.get(k), str) for k in ("role", "content"))
        if not is_message:
            raise _Malformed(f"prompt[{position}]", "must be a {role: str, content: str} message")
        messages.append(ChatMessage(message["role"], message["content"]))
    user_turns = [position for position, message in enumerate(messages) if message.role == "user"]
    if not user_turns:
        raise _Malformed("prompt", "has no user message")
    problem, _ = strip_template(messages[user_turns[-1]].content, templates)
    if not problem:
        raise _Malformed(f"prompt[{user_turns[-1]}].content", "is empty")
    reward_model = row["reward_model"]
    if not isinstance(reward_model, dict):
        raise _Malformed("reward_model", f"must be a mapping, got {type(reward_model).__name__}")
    if reward_model.get("ground_truth") is None:
        raise _Malformed("reward_model.ground_truth", "is missing")
    ground_truth = _answer_text(reward_model["ground_truth"], "reward_model.ground_truth")
    extra_info = row.get("extra_info") or {}
    if not isinstance(extra_info, dict):
        raise _Malformed("extra_info", f"must be a mapping, got {type(extra_info).__name__}")
    uid = extra_info.get("index")
    return MathProblem(
        uid=uid_fallback if uid is None else str(uid),
        problem=problem,
        ground_truth=ground_truth,
        data_source=row["data_source"],
        prompt_messages=tuple(messages),
        extra_info=extra_info,
    )


def _parse_simple_row(row: dict, uid_fallback: str, default_source: str) -> MathProblem:
    problem_key = "Problem" if "Problem" in row else "problem"
    answer_key = "Answer" if "Answer" in row else "answer"
    problem = row.get(problem_key)
    if problem is None:
        raise _Malformed(problem_key, "is missing")
    if not isinstance(problem, str):
        raise _Malformed(problem_key, f"must be a string, got {type(problem).__name__}")
    if not problem.strip():
        raise _Malformed(problem_key, "is empty")
    if row.get(answer_key) is None:
        raise _Malformed(answer_key, "is missing")
    uid = row.get("id", row.get("ID"))
    source = row.get("data_source")
    return MathProblem(
        uid=uid_fallback if uid is None else str(uid),
        problem=problem.strip(),
        ground_truth=_answer_text(row[answer_key], answer_key),
        data_source=source if isinstance(source, str) else default_source,
        extra_info={k: v for k, v in row.items() if k not in (problem_key, answer_key)},
    )


def load_problems(
    path: str | Path,
    *,
    layout: str = "auto",
    on_malformed: OnMalformed = "skip",
    dedupe: bool = True,
    templates: Sequence[str] = (DAPO_PROMPT_TEMPLATE,),
    default_data_source: str | None = None,
) -> LoadedProblems:
    """Load one file. ``layout="auto"`` decides from the first decodable row; ``templates`` are the prompt
    templates to strip from stored prompts (DAPO's by default); a file with no usable row is an error."""
    path = Path(path)
    if on_malformed not in MALFORMED_POLICIES:
        raise RecipeError(f"on_malformed must be one of {MALFORMED_POLICIES}, got {on_malformed!r}")
    if layout not in LAYOUTS:
        raise RecipeError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    default_source = default_data_source or path.stem
    kept: dict[str, MathProblem] = {}
    rows_read = duplicates = conflicts = 0
    malformed: list[MalformedRow] = []
    malformed_count = 0
    for index, row in iter_rows(path):
        rows_read += 1
        try:
            if isinstance(row, _Malformed):
                raise row
            if not isinstance(row, dict):
                raise _Malformed("<row>", f"must be an object, got {type(row).__name__}")
            if layout == "auto":
                layout = _detect_layout(row) or "auto"
                if layout == "auto":
                    raise DataError(f"{path}: row {index}: unrecognised layout; columns are {sorted(row)}")
            uid_fallback = f"{path.stem}:{index}"
            if layout == "dapo":
                record = _parse_dapo_row(row, uid_fallback, templates)
            else:
                record = _parse_simple_row(row, uid_fallback, default_source)
        except _Malformed as bad:
            report = MalformedRow(str(path), index, bad.field, bad.reason)
            if on_malformed == "fail":
                raise DataError(str(report)) from None
            malformed_count += 1
            if len(malformed) < MAX_REPORTED_MALFORMED:
                malformed.append(report)
            continue
        key = record.problem if dedupe else f"{len(kept)}"
        if key in kept:
            duplicates += 1
            conflicts += kept[key].ground_truth != record.ground_truth
            continue
        kept[key] = record
    if not kept:
        first = f"; first malformed: {malformed[0]}" if malformed else ""
        raise DataError(f"{path}: no usable rows ({rows_read} read, {malformed_count} malformed){first}")
    stats = LoadStats(str(path), layout, rows_read, len(kept), duplicates, conflicts, malformed_count, tuple(malformed))
    return LoadedProblems(tuple(kept.values()), stats)


def load_dapo_math(path: str | Path, **options: Any) -> LoadedProblems:
    """DAPO-Math-17K in verl's layout (parquet or jsonl); ~17.9K problems from the ~1.79M-row release."""
    return load_problems(path, layout="dapo", **options)


def load_aime2024(path: str | Path, **options: Any) -> LoadedProblems:
    """AIME-2024 in either layout: 30 ``problem``/``answer`` rows, or the 960-row DAPO-layout repeat."""
    options.setdefault("default_data_source", "aime2024")
    return load_problems(path, layout="auto", **options)
