"""Other frameworks' logs into the same frames as our own: a W&B CSV export, or a verl/LumenRL JSONL.

Key map (verl/LumenRL name -> ours; every key not listed is kept under its own name):

  timing_s/gen                      timing_s/rollout     (verl times generation as "gen")
  timing_s/old_log_prob             timing_s/old_logprob
  timing_s/update_actor             timing_s/update
  timing_s/update_weights           timing_s/sync        (trainer -> rollout weight sync)
  timing_s/testing                  timing_s/eval
  actor/pg_loss                     actor/loss
  val-core/<source>/acc/mean@<k>    eval/avg@<k>         (one data source; pick it with data_source=)
  step: training/global_step, else the row's step, else W&B's _step / panel "Step" column

Derived, and only where our own key is absent:
  reward/accuracy = (critic/score/mean + 1) / 2   exact for the DAPO reward (+1 correct, -1 otherwise) that
                   AMD's recipe and ours use; pass accuracy_from_score=False for a shaped reward.
  perf/rollout_tokens_per_s = response_length/mean * trajectories_per_step / timing_s/rollout, only when
                   trajectories_per_step is given (verl logs no generated-token count).
verl's perf/throughput is NOT mapped onto our rollout throughput: it is all tokens (prompt + response) per
second of the whole step per GPU, a different quantity; it is kept as perf/throughput.

Imported frames have no recipe (none travels with an export) and no per-problem eval counts, so held-out
accuracy comes without a bootstrap interval and GPU-hours need a GPU count from elsewhere.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from repro.analysis.frame import ACCURACY, SCORE, THROUGHPUT, MetricsError, RunFrames, read_jsonl

KEY_MAP = {
    "timing_s/gen": "timing_s/rollout",
    "timing_s/old_log_prob": "timing_s/old_logprob",
    "timing_s/update_actor": "timing_s/update",
    "timing_s/update_weights": "timing_s/sync",
    "timing_s/testing": "timing_s/eval",
    "actor/pg_loss": "actor/loss",
}
STEP_KEYS = ("training/global_step", "step", "_step", "Step")  # first present wins, row by row
VAL_CORE = re.compile(r"^val-core/(?P<source>.+)/acc/mean@(?P<k>\d+)$")
PANEL_COLUMN = re.compile(r"^(?P<run>.+) - (?P<metric>.+?)(?P<agg>__MIN|__MAX)?$")


def _val_sources(columns) -> dict[str, str]:
    return {m["source"]: c for c in columns if (m := VAL_CORE.match(c))}


def canonical_columns(columns, data_source: str | None, source: Path) -> dict[str, str]:
    """old name -> our name for every column that has one; raises when the eval data source is ambiguous."""
    mapping = {c: KEY_MAP[c] for c in columns if c in KEY_MAP and KEY_MAP[c] not in columns}
    sources = _val_sources(columns)
    if data_source is None and len(sources) > 1:
        raise MetricsError(f"{source}: several eval data sources ({', '.join(sorted(sources))}); pass data_source=")
    chosen = data_source if data_source is not None else next(iter(sources), None)
    if chosen is not None:
        if chosen not in sources:
            raise MetricsError(f"{source}: no column val-core/{chosen}/acc/mean@k (found: {', '.join(sorted(sources)) or 'none'})")
        mapping[sources[chosen]] = f"eval/avg@{VAL_CORE.match(sources[chosen])['k']}"
    return mapping


def _is_eval_column(name: str) -> bool:
    return name.startswith(("eval/", "val-core/", "val-aux/", "val/")) or name == "timing_s/eval"


def with_step_column(table: pd.DataFrame, source: Path) -> pd.DataFrame:
    """The table with one int ``step`` column first, coalesced row by row from STEP_KEYS (verl logs its val at
    step 0 before training/global_step exists, so W&B's _step fills that row)."""
    present = [k for k in STEP_KEYS if k in table.columns]
    if not present:
        raise MetricsError(f"{source}: no step column (looked for {', '.join(STEP_KEYS)})")
    step = pd.to_numeric(table[present[0]], errors="coerce")
    for key in present[1:]:
        step = step.fillna(pd.to_numeric(table[key], errors="coerce"))
    if step.isna().any():
        raise MetricsError(f"{source}: {int(step.isna().sum())} rows have no step value")
    out = table.drop(columns=present)
    out.insert(0, "step", step.astype("int64").to_numpy())
    return out


def frames_from_table(table: pd.DataFrame, source: Path, data_source: str | None = None,
                      accuracy_from_score: bool = True, trajectories_per_step: int | None = None) -> RunFrames:
    """One wide table (a row per logged step, train and eval keys mixed as verl logs them) -> RunFrames."""
    table = with_step_column(table, source)
    table = table.rename(columns=canonical_columns(table.columns, data_source, source))
    table = table.groupby("step", sort=True).last()  # a step logged in pieces (W&B history) becomes one row

    eval_cols = [c for c in table.columns if _is_eval_column(c)]
    train = table.drop(columns=eval_cols)
    metrics = [c for c in train.columns if not c.startswith("_")]  # W&B's _runtime/_timestamp exist on every row
    train = train[train[metrics].notna().any(axis=1)] if metrics else train.iloc[0:0]
    evals = table[eval_cols].dropna(how="all") if eval_cols else table.iloc[0:0, 0:0]
    if train.empty:
        raise MetricsError(f"{source}: no training metrics in the export")
    if accuracy_from_score and ACCURACY not in train.columns and SCORE in train.columns:
        train[ACCURACY] = (train[SCORE] + 1.0) / 2.0
    needed = {"response_length/mean", "timing_s/rollout"}
    if trajectories_per_step and THROUGHPUT not in train.columns and needed <= set(train.columns):
        train["perf/generated_tokens"] = train["response_length/mean"] * trajectories_per_step
        train[THROUGHPUT] = train["perf/generated_tokens"] / train["timing_s/rollout"]
    return RunFrames(train, evals, None, Path(source))


def _flatten(row: dict) -> dict:
    """verl's file logger writes {"step": n, "data": {...}}; other tools nest under "metrics"; flat rows pass."""
    for nested in ("data", "metrics"):
        if isinstance(row.get(nested), dict):
            return {**{k: v for k, v in row.items() if k != nested}, **row[nested]}
    return row


def read_verl_jsonl(path: str | Path, data_source: str | None = None, accuracy_from_score: bool = True,
                    trajectories_per_step: int | None = None) -> RunFrames:
    """A JSONL of verl/LumenRL metric dicts, one logged step per line."""
    path = Path(path)
    rows = [_flatten(r) for r in read_jsonl(path)]
    table = pd.DataFrame(rows)
    return frames_from_table(table, path, data_source, accuracy_from_score, trajectories_per_step)


def _panel_to_history(table: pd.DataFrame, path: Path, run: str | None) -> pd.DataFrame:
    """W&B panel export: x column first, then "<run> - <metric>" with "__MIN"/"__MAX" companions (the min and max
    of the points W&B merged when it downsampled the chart; the plain column is their mean). Keep the plain one."""
    x_column = table.columns[0]
    by_run: dict[str, dict[str, str]] = {}
    for column in table.columns[1:]:
        match = PANEL_COLUMN.match(column)
        if match is None:
            raise MetricsError(f"{path}: column {column!r} is not '<run> - <metric>' as in a W&B panel export")
        if match["agg"] is None:
            by_run.setdefault(match["run"], {})[column] = match["metric"]
    if run is None and len(by_run) > 1:
        raise MetricsError(f"{path}: export holds several runs ({', '.join(sorted(by_run))}); pass run=")
    chosen = run if run is not None else next(iter(by_run), None)
    if chosen not in by_run:
        raise MetricsError(f"{path}: no run {chosen!r} in the export (found: {', '.join(sorted(by_run))})")
    return table[[x_column, *by_run[chosen]]].rename(columns={**by_run[chosen], x_column: "Step"})


def read_wandb_csv(paths, run: str | None = None, data_source: str | None = None, accuracy_from_score: bool = True,
                   trajectories_per_step: int | None = None) -> RunFrames:
    """One or more W&B CSV exports of the same run: run-history exports (``_step`` + metric columns) and/or
    panel exports ("Step", "<run> - <metric>", "...__MIN", "...__MAX"), merged on the step."""
    paths = [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    if not paths:
        raise MetricsError("read_wandb_csv: no files given")
    parts = []
    for path in paths:
        if not path.is_file():
            raise MetricsError(f"{path}: W&B export not found")
        try:
            table = pd.read_csv(path)
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as err:
            raise MetricsError(f"{path}: not a readable CSV ({err})") from None
        table = table.drop(columns=[c for c in table.columns if c.startswith("Unnamed:")])  # a saved pandas index
        if table.empty:
            raise MetricsError(f"{path}: W&B export has no rows")
        if len(table.columns) > 1 and all(PANEL_COLUMN.match(c) for c in table.columns[1:]):
            table = _panel_to_history(table, path, run)
        parts.append(with_step_column(table, path).groupby("step", sort=True).last())
    merged = parts[0]
    for part in parts[1:]:  # one panel per metric is the usual export: align them on the step
        merged = merged.combine_first(part)
    merged = merged.reset_index()
    return frames_from_table(merged, paths[0] if len(paths) == 1 else paths[0].parent, data_source,
                             accuracy_from_score, trajectories_per_step)
