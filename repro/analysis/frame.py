"""A run's metrics as two pandas frames (train rows by step, eval rows by step) plus what is known about where
they came from.

Column names are our own log keys (repro/metric_keys.py: ``reward/accuracy``, ``rollout_corr/kl``,
``timing_s/step``, ``eval/avg@8`` ...); the importers map W&B exports, verl/LumenRL JSONL and LumenRL text logs
onto the same names, so every summary, comparison and figure reads one vocabulary.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from repro.errors import ReproError, TornLineWarning  # noqa: F401  (TornLineWarning: re-exported)
from repro.metric_rows import RowError, check_imported_row, check_own_row, left_out, non_finite
# The canonical names the analysis reads; anything else in a log is kept as it is.
from repro.metric_keys import (  # noqa: F401  (re-exported: importers, plots and compare read them here)
    ACCURACY, CORRECT_COUNTS, ESS, EVAL_SECONDS, K3_KL, KL, SAMPLES_PER_PROBLEM, SCORE, STEP_SECONDS, THROUGHPUT,
)
from repro.recipes import validate_recipe
from repro.recipes.backends import engine_of, function_named
from repro.recipes.earlier import EARLIER_CONVENTIONS, EARLIER_IS_METRICS_NOTE, fill_earlier_conventions
from repro.recipes.schema import Recipe

METRICS_FILE = "metrics.jsonl"
RECIPE_FILE = "recipe.yaml"


class MetricsError(ReproError, ValueError):
    """A metrics log or export is missing, empty, corrupt, or lacks a column the analysis needs."""


@dataclass
class RunFrames:
    """train: one row per optimizer step, index ``step`` (1-based). eval: one row per evaluation, index ``step``
    (0 = before the first update).

    recipe: the run's resolved recipe, or None for an imported log (no recipe travels with it).
    label: the name tables and legends use for this source. kind: "repro", "wandb", "lumenrl" or "jsonl".
    origins: our column -> the key it was read from, where an importer renamed one (``perf/rollout_tokens_per_s``
    <- ``throughput/gen_tok_per_s``). notes: what the importer had to decide about this log, in sentences.
    step_time_includes_eval: ``timing_s/step`` already contains the evaluation time of steps that evaluated
    (verl and LumenRL time validation inside the step; our own loop logs it apart as ``timing_s/eval``).
    restarts: the log's ``restart`` rows (a worker died and the run restarted itself: step, attempt, worker, call,
    cause, resumed_from), in order; they are no step's result and appear in neither frame.
    """

    train: pd.DataFrame
    eval: pd.DataFrame
    recipe: Recipe | None
    source: Path
    label: str = ""
    kind: str = "repro"
    origins: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    step_time_includes_eval: bool = False
    restarts: list[dict] = field(default_factory=list)

    def __post_init__(self):
        self.source = Path(self.source)
        if not self.label:
            self.label = self.source.stem if self.source.suffix else self.source.name

    @property
    def avg_key(self) -> str | None:
        """The eval accuracy column, ``eval/avg@k`` for whatever k the run used."""
        keys = [c for c in self.eval.columns if c.startswith("eval/avg@")]
        return keys[0] if keys else None

    @property
    def planned_steps(self) -> int | None:
        """The steps the run was meant to take (its recipe's), or None when no recipe came with the log."""
        return self.recipe.steps if self.recipe is not None else None

    @property
    def has_problem_counts(self) -> bool:
        """Whether evaluations carry per-problem correct counts (what a bootstrap interval needs)."""
        return CORRECT_COUNTS in self.eval.columns and self.eval[CORRECT_COUNTS].notna().any()

    def origin(self, column: str) -> str:
        """The key a column was read under in the source log (itself when nothing was renamed)."""
        return self.origins.get(column, column)

    def require(self, column: str, frame: str = "train") -> pd.Series:
        table = self.train if frame == "train" else self.eval
        if column not in table.columns:
            raise MetricsError(f"{self.source}: no column {column!r} in the {frame} rows")
        return table[column].dropna()


def frames_from_rows(rows: list[dict], source: Path, recipe: Recipe | None = None, **about) -> RunFrames:
    """Split rows by ``kind`` into step-indexed frames (``restart`` rows aside, in ``restarts``). A step logged twice
    keeps its last row (a resumed run whose log was not truncated repeats steps; the later row is the one the run
    continued from)."""
    train = [r for r in rows if r.get("kind", "train") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    restarts = [r for r in rows if r.get("kind") == "restart"]
    if not train:
        raise MetricsError(f"{source}: no training rows (kind 'train') in the log")
    return RunFrames(_by_step(train, source), _by_step(evals, source), recipe, Path(source), restarts=restarts,
                     **about)


def _by_step(rows: list[dict], source: Path) -> pd.DataFrame:
    if not rows:
        return pd.DataFrame(index=pd.Index([], name="step", dtype="int64"))
    if any("step" not in r for r in rows):
        raise MetricsError(f"{source}: a row has no 'step'")
    table = pd.DataFrame(rows).drop(columns=["kind"], errors="ignore")
    table["step"] = table["step"].astype("int64")
    table = table.drop_duplicates("step", keep="last").set_index("step").sort_index()
    return table


def warn_torn_line(path: Path, number: int, why: str) -> None:
    warnings.warn(f"{path}:{number}: torn last line dropped ({why}); a run killed mid-write leaves one",
                  TornLineWarning, stacklevel=3)


def read_text(path: Path, what: str) -> str:
    """The file as text, or MetricsError naming it when it is not (a binary file given as a log)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise MetricsError(f"{path}: not text (byte {err.start} is not UTF-8); {what} is UTF-8 text") from None
    if "\0" in text:
        raise MetricsError(f"{path}: not text (it holds NUL bytes); {what} is UTF-8 text")
    return text


def read_jsonl_numbered(path: Path) -> list[tuple[int, dict]]:
    """(line number, row) of a JSONL log. A torn last line (a run killed mid-write) is dropped with a
    TornLineWarning naming the file and line, as the run itself drops it; a bad line anywhere else is corruption
    and is an error."""
    path = Path(path)
    if not path.is_file():
        raise MetricsError(f"{path}: metrics log not found")
    lines = read_text(path, "a metrics log").splitlines()
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines):
                warn_torn_line(path, number, f"not valid JSON: {err.msg}")
                break
            raise MetricsError(f"{path}:{number}: corrupt line ({err.msg})") from None
        if not isinstance(row, dict):
            raise MetricsError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
        rows.append((number, row))
    if not rows:
        raise MetricsError(f"{path}: metrics log is empty")
    return rows


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSONL log (``read_jsonl_numbered`` without the line numbers)."""
    return [row for _, row in read_jsonl_numbered(path)]


MAX_NOTES = 5  # non-finite values named one by one; beyond these, counted


def checked_rows(numbered: list[tuple[int, dict]], path: Path, *, own: bool,
                 step_keys: tuple[str, ...] = ("step",)) -> tuple[list[dict], list[str]]:
    """The rows with every value checked (repro.metric_rows: the run's own rules when ``own``, an imported log's
    otherwise), each non-finite number set to None (missing) and named in the notes returned."""
    rows, notes = [], []
    for number, row in numbered:
        try:
            (check_own_row(row, f"{path}:{number}") if own
             else check_imported_row(row, f"{path}:{number}", step_keys))
        except RowError as err:
            raise MetricsError(str(err)) from None
        bad = [k for k, v in row.items() if non_finite(v)]
        if bad:
            step = next((row[k] for k in step_keys if row.get(k) is not None), "?")
            notes += [left_out(step, k, row[k]) for k in bad]
            row = {k: (None if k in bad else v) for k, v in row.items()}
        rows.append(row)
    if len(notes) > MAX_NOTES:
        notes = notes[:MAX_NOTES] + [f"{len(notes) - MAX_NOTES} more non-finite values left out"]
    return rows, notes


def read_recipe(path: Path) -> tuple[Recipe, list[str]]:
    """A run's resolved recipe, and the convention keys it predates (filled with what repro then ran:
    ``repro.recipes.earlier``)."""
    if not path.is_file():
        raise MetricsError(f"{path}: recipe not found (a run dir holds the resolved recipe.yaml)")
    try:
        data = yaml.safe_load(read_text(path, "a recipe"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise MetricsError(f"{where}: not valid YAML ({getattr(err, 'problem', None) or err})") from None
    if not isinstance(data, dict):
        raise MetricsError(f"{path}: expected a recipe mapping")
    filled = fill_earlier_conventions(data)
    return validate_recipe(data, source=str(path)), filled


def earlier_notes(filled: list[str]) -> list[str]:
    if not filled:
        return []
    values = ", ".join(f"{key}={EARLIER_CONVENTIONS[key]}" for key in filled)
    return [f"The run predates the recipe fields {', '.join(filled)}: read as what repro then ran ({values}); "
            f"{EARLIER_IS_METRICS_NOTE}."]


def load_run(run_dir: str | Path, label: str = "") -> RunFrames:
    """The frames of a run dir written by ``repro run`` (metrics.jsonl + recipe.yaml), whichever engine ran it."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise MetricsError(f"{run_dir}: run directory not found")
    path = run_dir / METRICS_FILE
    recipe, filled = read_recipe(run_dir / RECIPE_FILE)
    about = {}
    engine = engine_of(recipe)
    if engine.about_run_dir is not None:  # rows streamed from the engine's own log: key origins, step-time convention
        about = function_named(engine.about_run_dir)(run_dir)
    rows, left = checked_rows(read_jsonl_numbered(path), path, own=True)
    frames = frames_from_rows(rows, path, recipe, label=label or run_dir.name, kind="repro", **about)
    frames.notes.extend(earlier_notes(filled) + left)
    return frames
