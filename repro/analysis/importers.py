"""Other frameworks' logs into the same frames as our own: W&B CSV exports and verl/LumenRL JSONL (LumenRL's text
log: repro/analysis/lumenrl_log.py, which ends in ``frames_from_table`` here too).

Synonyms (ours <- theirs, the first present in a log wins; every key not listed is kept under its own name):

  timing_s/rollout           timing_s/gen (verl), timing/gen_s (LumenRL)
  timing_s/old_logprob       timing_s/old_log_prob
  timing_s/update            timing_s/update_actor, timing/train_s
  timing_s/sync              timing_s/update_weights, timing/weight_sync_s (LumenRL logs it only above 1 s)
  timing_s/eval              timing_s/testing                 (kept on evaluation rows only)
  timing_s/step              timing/step_s   (LumenRL's own step time stops before weight sync and validation)
  actor/loss                 actor/pg_loss, loss
  actor/grad_norm, actor/entropy, actor/lr     grad_norm, entropy, lr
  critic/score/mean          reward/mean
  response_length/mean       seq/mean_response_len
  perf/rollout_tokens_per_s  throughput/gen_tok_per_s   (LumenRL: response tokens / generation wall time of the
                             step, the whole rollout group, the same quantity as AMD's 311 tok/s)
  eval/avg@<k>               val-core/<source>/acc/mean@<k>   (one data source; pick it with data_source=)
  step                       training/global_step (verl), train/global_step (LumenRL's W&B x-axis), step,
                             W&B's _step, a panel export's first column

Kept under their own names because they are other quantities: verl's perf/throughput (prompt + response tokens
per second of the whole step per GPU), LumenRL's mismatch/k3_kl, mismatch/chi2_token, mismatch/chi2_seq (computed
on π_rollout/π_trainer, the reciprocal of the ratio our rollout_corr/k3_kl and chi2 use; only LumenRL's FSDP loss
logs them, its DeepSeek-V4 Megatron path never does) and timing/weight_sync_rdma_s (the RDMA transfer inside the
sync). LumenRL's KL by response position, rollout_corr/pos_{first}_{last}/{kl,abs_diff,k3_kl,tokens} (2232f55 on),
has our names already (repro.metric_keys.POSITION_KEYS) and passes through as it is, from text logs and from W&B
exports (whose train/ mirrors of it collapse as below).

Mirrors: LumenRL's W&B payload repeats every key under ``train/`` and some under ``core/``; a mirror column is
dropped when the key it copies is present (a ``train/x`` whose ``x`` is absent, as older LumenRL logged only
``train/`` keys, is renamed to ``x``).

Derived, and only where our own key is absent:
  reward/accuracy = (critic/score/mean + 1) / 2   exact for the DAPO reward (+1 correct, -1 otherwise) that
                   AMD's recipe and ours use; pass accuracy_from_score=False for a shaped reward.
  perf/rollout_tokens_per_s = response_length/mean * trajectories_per_step / timing_s/rollout, only when
                   trajectories_per_step is given (verl logs no generated-token count).

Steps: a training row at step 0 means the log counts from 0 (LumenRL before its 1-based change); such logs are
shifted by one so step N is the N-th update everywhere. Imported frames have no recipe and no per-problem eval
counts: held-out accuracy comes without a bootstrap interval and GPU-hours need a GPU count from elsewhere.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import pandas as pd

from repro.analysis.frame import (ACCURACY, MAX_NOTES, SCORE, STEP_SECONDS, THROUGHPUT, MetricsError, RunFrames,
                                  checked_rows, frames_from_rows, read_jsonl_numbered)
from repro.metric_rows import MAX_STEP, RowError, left_out, step_number
from repro.metric_keys import (
    ENTROPY, EVAL_AVG_PREFIX, EVAL_SECONDS, GENERATED_TOKENS, GRAD_NORM, LOSS, LR, RESPONSE_LENGTH, timing_key,
)

SYNONYMS: dict[str, tuple[str, ...]] = {
    timing_key("rollout"): ("timing_s/gen", "timing/gen_s"),
    timing_key("old_logprob"): ("timing_s/old_log_prob",),
    timing_key("update"): ("timing_s/update_actor", "timing/train_s"),
    timing_key("sync"): ("timing_s/update_weights", "timing/weight_sync_s"),
    EVAL_SECONDS: ("timing_s/testing",),
    STEP_SECONDS: ("timing/step_s",),
    LOSS: ("actor/pg_loss", "loss"),  # the right-hand names are other logs' spellings, not ours
    GRAD_NORM: ("grad_norm",),
    ENTROPY: ("entropy",),
    LR: ("lr",),
    SCORE: ("reward/mean",),
    RESPONSE_LENGTH: ("seq/mean_response_len",),
    THROUGHPUT: ("throughput/gen_tok_per_s",),
}
STEP_KEYS = ("training/global_step", "train/global_step", "step", "_step", "Step")  # first present wins, row by row
MIRROR_PREFIXES = ("train/", "core/")
VAL_CORE = re.compile(r"^val-core/(?:(?P<source>.+)/)?acc/mean@(?P<k>\d+)$")
PANEL_COLUMN = re.compile(r"^(?P<run>.+) - (?P<metric>.+?)(?P<agg>__MIN|__MAX)?$")
EVAL_PREFIXES = ("eval/", "val-core/", "val-aux/", "val/")


def _val_sources(columns) -> dict[str, str]:
    """data source -> its val-core accuracy column; LumenRL also logs a source-less ``val-core/acc/mean@k``
    beside the named one, which is used only when no named source exists."""
    named = {m["source"]: c for c in columns if (m := VAL_CORE.match(c)) and m["source"]}
    if named:
        return named
    return {"": c for c in columns if (m := VAL_CORE.match(c))}


def canonical_columns(columns, data_source: str | None, source: Path) -> dict[str, str]:
    """their name -> our name for every column that has one; raises when the eval data source is ambiguous."""
    present = set(columns)
    mapping = {}
    for ours, theirs in SYNONYMS.items():
        found = next((t for t in theirs if t in present), None)
        if ours not in present and found is not None:
            mapping[found] = ours
    sources = _val_sources(columns)
    if data_source is None and len(sources) > 1:
        raise MetricsError(f"{source}: several eval data sources ({', '.join(sorted(sources))}); pass data_source=")
    chosen = data_source if data_source is not None else next(iter(sources), None)
    if chosen is not None:
        if chosen not in sources:
            raise MetricsError(f"{source}: no column val-core/{chosen}/acc/mean@k "
                               f"(found: {', '.join(sorted(sources)) or 'none'})")
        mapping[sources[chosen]] = f"{EVAL_AVG_PREFIX}{VAL_CORE.match(sources[chosen])['k']}"
    return mapping


def collapse_mirrors(table: pd.DataFrame) -> pd.DataFrame:
    """Drop W&B mirror columns: ``train/x`` when ``x`` is present (a lone ``train/x`` is renamed ``x``), ``core/x``
    when another column holds the same values (LumenRL's core/ names differ from the keys they copy)."""
    mirrors = [c for c in table.columns if c.startswith(MIRROR_PREFIXES) and c not in STEP_KEYS]
    originals = [c for c in table.columns if c not in mirrors and c not in STEP_KEYS
                 and pd.api.types.is_numeric_dtype(table[c])]
    values = [table[c].to_numpy(dtype=float) for c in originals]
    drop, rename = [], {}
    for column in mirrors:
        bare = column.split("/", 1)[1]
        if column.startswith("train/"):
            if bare in table.columns:
                drop.append(column)
            else:
                rename[column] = bare
        elif pd.api.types.is_numeric_dtype(table[column]) and any(
                np.array_equal(table[column].to_numpy(dtype=float), v, equal_nan=True) for v in values):
            drop.append(column)
    return table.drop(columns=drop).rename(columns=rename)


def _is_eval_column(name: str) -> bool:
    return name.startswith(EVAL_PREFIXES) or name == EVAL_SECONDS


def with_step_column(table: pd.DataFrame, source: Path, lines: list[int] | None = None) -> pd.DataFrame:
    """The table with one int ``step`` column first, coalesced row by row from STEP_KEYS (verl logs its val at
    step 0 before training/global_step exists, so W&B's _step fills that row). A step that is not a whole number
    in 0..MAX_STEP is refused, naming the file and (``lines``: the line of each row) the line."""
    present = [k for k in STEP_KEYS if k in table.columns]
    if not present:
        raise MetricsError(f"{source}: no step column (looked for {', '.join(STEP_KEYS)})")
    step = pd.to_numeric(table[present[0]], errors="coerce")
    for key in present[1:]:
        step = step.fillna(pd.to_numeric(table[key], errors="coerce"))
    if step.isna().any():
        raise MetricsError(f"{source}: {int(step.isna().sum())} rows have no step value")
    values = step.to_numpy(dtype=float)
    bad = np.flatnonzero(~np.isfinite(values) | (values != np.round(values)) | (values < 0) | (values > MAX_STEP))
    if len(bad):
        row = int(bad[0])
        where = f"{source}:{lines[row]}" if lines is not None else f"{source} (row {row + 1})"
        try:
            step_number(float(values[row]), f"{where}: step")
        except RowError as err:
            raise MetricsError(str(err)) from None
    out = table.drop(columns=present)
    out.insert(0, "step", step.astype("int64").to_numpy())
    return out


def _without_infinities(table: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Infinite values set missing (left out of every mean), each named in a note (a CSV's NaN is W&B's blank)."""
    notes = []
    numeric = [c for c in table.columns if c != "step" and pd.api.types.is_float_dtype(table[c])]
    for column in numeric:
        infinite = np.isinf(table[column].to_numpy())
        if infinite.any():
            notes += [left_out(int(table["step"].iloc[i]), column, float(table[column].iloc[i]))
                      for i in np.flatnonzero(infinite)]
            table[column] = table[column].where(~infinite)
    if len(notes) > MAX_NOTES:
        notes = notes[:MAX_NOTES] + [f"{len(notes) - MAX_NOTES} more non-finite values left out"]
    return table, notes


def frames_from_table(table: pd.DataFrame, source: Path, data_source: str | None = None,
                      accuracy_from_score: bool = True, trajectories_per_step: int | None = None,
                      kind: str = "jsonl", label: str = "", notes: list[str] | None = None,
                      lines: list[int] | None = None) -> RunFrames:
    """One wide table (a row per logged step, train and eval keys mixed as verl and LumenRL log them) -> RunFrames.
    ``lines``: the source line of each row, for errors."""
    notes = list(notes or [])
    table = with_step_column(collapse_mirrors(table), source, lines)
    table, left = _without_infinities(table)
    notes += left
    mapping = canonical_columns(table.columns, data_source, source)
    table = table.rename(columns=mapping).groupby("step", sort=True).last()  # a step logged in pieces: one row
    origins = {ours: theirs for theirs, ours in mapping.items()}

    evals_present = [c for c in table.columns if _is_eval_column(c) and c != EVAL_SECONDS]
    eval_rows = table[evals_present].notna().any(axis=1) if evals_present else pd.Series(False, index=table.index)
    eval_cols = [c for c in table.columns if _is_eval_column(c)]
    evals = table.loc[eval_rows, eval_cols]  # timing_s/testing sits on every LumenRL row; an evaluation needs a score
    train = table.drop(columns=eval_cols)
    metrics = [c for c in train.columns if not c.startswith("_")]  # W&B's _runtime/_timestamp exist on every row
    train = train[train[metrics].notna().any(axis=1)] if metrics else train.iloc[0:0]
    if train.empty:
        raise MetricsError(f"{source}: no training metrics in the log")
    if train.index.min() == 0:
        train.index, evals.index = train.index + 1, evals.index + 1
        notes.append("The log counts steps from 0 (LumenRL before its 1-based logging); shifted by one so step N "
                     "is the state after N updates")
    if accuracy_from_score and ACCURACY not in train.columns and SCORE in train.columns:
        train[ACCURACY] = (train[SCORE] + 1.0) / 2.0
        origins[ACCURACY] = f"(1 + {origins.get(SCORE, SCORE)}) / 2"
    needed = {RESPONSE_LENGTH, timing_key("rollout")}
    if trajectories_per_step and THROUGHPUT not in train.columns and needed <= set(train.columns):
        train[GENERATED_TOKENS] = train[RESPONSE_LENGTH] * trajectories_per_step
        train[THROUGHPUT] = train[GENERATED_TOKENS] / train[timing_key("rollout")]
        origins[THROUGHPUT] = f"{RESPONSE_LENGTH} x {trajectories_per_step} / {timing_key('rollout')}"
    includes_eval = STEP_SECONDS in train.columns and origins.get(STEP_SECONDS, STEP_SECONDS) == STEP_SECONDS
    return RunFrames(train, evals, None, Path(source), label=label, kind=kind, origins=origins, notes=notes,
                     step_time_includes_eval=includes_eval)


def _flatten(row: dict) -> dict:
    """verl's file logger writes {"step": n, "data": {...}}; other tools nest under "metrics"; flat rows pass."""
    for nested in ("data", "metrics"):
        if isinstance(row.get(nested), dict):
            return {**{k: v for k, v in row.items() if k != nested}, **row[nested]}
    return row


def read_verl_jsonl(path: str | Path, data_source: str | None = None, accuracy_from_score: bool = True,
                    trajectories_per_step: int | None = None, label: str = "") -> RunFrames:
    """A JSONL of verl/LumenRL metric dicts, one logged step per line (our own metrics.jsonl, whose rows carry
    ``kind``, is read as it is written)."""
    path = Path(path)
    numbered = [(n, _flatten(r)) for n, r in read_jsonl_numbered(path)]
    if all("kind" in r for _, r in numbered):
        rows, left = checked_rows(numbered, path, own=True)
        frames = frames_from_rows(rows, path, None, label=label, kind="repro")
        frames.notes.extend(left)
        return frames
    rows, left = checked_rows(numbered, path, own=False, step_keys=STEP_KEYS)
    return frames_from_table(pd.DataFrame(rows), path, data_source, accuracy_from_score, trajectories_per_step,
                             kind="jsonl", label=label, notes=left, lines=[n for n, _ in numbered])


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


def _record_lines(path: Path) -> list[int]:
    """The line each CSV record ends on (record 0 = the header), checking every record has the header's width."""
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if not header:
                raise MetricsError(f"{path}: not a readable CSV (the file is empty)")
            lines = [reader.line_num]
            for record in reader:
                if record and len(record) != len(header):
                    raise MetricsError(f"{path}:{reader.line_num}: {len(record)} fields where the header has "
                                       f"{len(header)} (a cut or hand-edited export?)")
                lines.append(reader.line_num)
    except (UnicodeDecodeError, csv.Error) as err:
        raise MetricsError(f"{path}: not a readable CSV ({err})") from None
    return lines


def _numeric_columns(table: pd.DataFrame, path: Path, lines: list[int], notes: list[str]) -> pd.DataFrame:
    """Every column as numbers. A column with no number at all (W&B tables and media, a run name) is left out with a
    note; a number column holding one word is corrupt and named by file, line and column."""
    out, dropped = {}, []
    for column in table.columns:
        raw = table[column]
        values = pd.to_numeric(raw, errors="coerce")
        bad = values.isna() & raw.notna() & (raw.astype(str).str.strip() != "")
        if bad.any() and values.notna().any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise MetricsError(f"{path}:{lines[row + 1]}: column {column!r} holds {raw.iloc[row]!r}, not a number")
        if bad.any():
            dropped.append(column)
            continue
        out[column] = values
    if dropped:
        notes.append(f"Left out of {path.name}, columns without numbers: {', '.join(dropped)}")
    return pd.DataFrame(out, index=table.index)


def read_wandb_csv(paths, run: str | None = None, data_source: str | None = None, accuracy_from_score: bool = True,
                   trajectories_per_step: int | None = None, label: str = "") -> RunFrames:
    """One or more W&B CSV exports of the same run: run-history exports (``_step`` + metric columns) and/or
    panel exports ("Step", "<run> - <metric>", "...__MIN", "...__MAX"), merged on the step."""
    paths = [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    if not paths:
        raise MetricsError("read_wandb_csv: no files given")
    parts, notes = [], []
    for path in paths:
        if not path.is_file():
            raise MetricsError(f"{path}: W&B export not found")
        lines = _record_lines(path)
        try:
            table = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=["", "NaN", "nan"])
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as err:
            raise MetricsError(f"{path}: not a readable CSV ({err})") from None
        table = table.drop(columns=[c for c in table.columns if c.startswith("Unnamed:")])  # a saved pandas index
        if table.empty:
            raise MetricsError(f"{path}: W&B export has no rows")
        if len(table.columns) > 1 and all(PANEL_COLUMN.match(c) for c in table.columns[1:]):
            table = _panel_to_history(table, path, run)
        table = _numeric_columns(table, path, lines, notes)
        parts.append(with_step_column(table, path, lines[1:]).groupby("step", sort=True).last())
    merged = parts[0]
    for part in parts[1:]:  # one panel per metric is the usual export: align them on the step
        merged = merged.combine_first(part)
    source = paths[0] if len(paths) == 1 else paths[0].parent
    return frames_from_table(merged.reset_index(), source, data_source, accuracy_from_score, trajectories_per_step,
                             kind="wandb", label=label, notes=notes)
