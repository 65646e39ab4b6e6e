"""A run source is whatever holds a run's metrics; every analysis notebook and command takes one or several.

A source is written ``[LABEL=][KIND:]PATH``:

  runs/tiny-cpu                     a repro run directory (metrics.jsonl + recipe.yaml)
  exports/history.csv               a W&B CSV export (run history or a panel export)
  wandb:exports/                    every *.csv in a folder, as exports of one run (also a quoted glob: 'x/*.csv')
  logs/train.log                    a LumenRL console log (its 'step=N k=v ...' lines among other output)
  verl:metrics.jsonl                a verl / LumenRL JSONL (one metrics dict per line)
  r3-off=lumenrl:logs/r3off.log     the same, labelled "r3-off" in tables and legends

KIND is one of run, wandb, lumenrl, verl (jsonl is another name for verl); without it the kind is read from the
content. A label defaults to the run folder's or file's name. ``lumenrl:`` on a .csv or .jsonl file reads it as
LumenRL's W&B export or JSONL (the same readers; LumenRL's key names are in the importers' map).
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from pathlib import Path

from repro.analysis.frame import METRICS_FILE, RECIPE_FILE, MetricsError, RunFrames, load_run
from repro.analysis.importers import read_verl_jsonl, read_wandb_csv
from repro.analysis.lumenrl_log import is_lumenrl_log, read_lumenrl_log
from repro.paths import project_path, resolve_parameter

SNIFF_BYTES = 1 << 20  # enough of a log to find its first metrics line among start-up output


def _wandb(paths: list[Path], data_source: str | None, wandb_run: str | None, label: str) -> RunFrames:
    return read_wandb_csv(paths, run=wandb_run, data_source=data_source, label=label)


def _jsonl(paths: list[Path], data_source: str | None, wandb_run: str | None, label: str) -> RunFrames:
    return read_verl_jsonl(paths[0], data_source=data_source, label=label)


def _console_log(paths: list[Path], data_source: str | None, wandb_run: str | None, label: str) -> RunFrames:
    return read_lumenrl_log(paths[0], data_source=data_source, label=label)


# kind -> its reader by the file's suffix ("": any other; ".csv" also reads a folder of W&B exports). A kind names
# a file format, not an engine: LumenRL's JSONL and W&B exports are verl's formats under LumenRL's key names, which
# the importers' map renames whichever kind is given.
READERS = {
    "wandb": {"": _wandb, ".csv": _wandb},
    "verl": {"": _jsonl},
    "lumenrl": {".csv": _wandb, ".jsonl": _jsonl, ".json": _jsonl, "": _console_log},
}
KINDS = ("run", *READERS, "jsonl")


@dataclass(frozen=True)
class SourceSpec:
    """One source as written (``text``), split into its label, kind (None: detect) and path or glob."""

    text: str
    label: str | None
    kind: str | None
    path: str


def parse_source(text: str | os.PathLike) -> SourceSpec:
    """Split ``[LABEL=][KIND:]PATH``. A path that exists as written is never split (a file may contain ':')."""
    raw = os.fspath(text).strip()
    if not raw:
        raise MetricsError("empty run source (expected a run directory, W&B CSV, LumenRL log or JSONL)")
    if Path(raw).expanduser().exists():
        return SourceSpec(raw, None, None, raw)
    label, rest = None, raw
    head, sep, tail = raw.partition("=")
    if sep and head and not any(c in head for c in ("/", os.sep, ":")):
        label, rest = head, tail
    kind, path = None, rest
    head, sep, tail = rest.partition(":")
    if sep and head.lower() in KINDS:
        kind, path = head.lower(), tail
    elif sep and head and "/" not in head and len(head) > 1:
        raise MetricsError(f"{raw}: unknown source kind {head!r} (use one of {', '.join(KINDS)})")
    if not path:
        raise MetricsError(f"{raw}: no path after the source kind")
    return SourceSpec(raw, label, "verl" if kind == "jsonl" else kind, path)


def _expand(spec: SourceSpec, base: Path | None) -> list[Path]:
    """The files or folder a spec names: the path itself, or the sorted matches of a glob."""
    path = Path(spec.path).expanduser()
    if base is not None and not path.is_absolute():
        path = base / path
    if path.exists():
        return [path]
    matches = sorted(Path(p) for p in glob.glob(str(path)))
    if not matches:
        raise MetricsError(f"{spec.text}: no such file or folder ({path})")
    return matches


def _sniff(path: Path) -> str:
    with open(path, "rb") as handle:
        return handle.read(SNIFF_BYTES).decode("utf-8", errors="replace")


def _json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def detect_kind(paths: list[Path]) -> str:
    """run / wandb / lumenrl / verl, from what the files hold. Raises naming the path when it cannot tell."""
    first = paths[0]
    if first.is_dir():
        if (first / METRICS_FILE).is_file():
            return "run"
        if sorted(first.glob("*.csv")):
            return "wandb"
        raise MetricsError(f"{first}: a folder without {METRICS_FILE} (a repro run) or *.csv files (W&B exports); "
                           "name a file, or prefix the kind (run:, wandb:, lumenrl:, verl:)")
    if first.name == METRICS_FILE and (first.parent / RECIPE_FILE).is_file():
        return "run"
    text = _sniff(first)
    head = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if _json_object(head):  # a log that merely starts with a printed dict is not JSONL
        return "verl"
    if first.suffix.lower() == ".csv" or ("," in head and ("_step" in head or "Step" in head or " - " in head)):
        return "wandb"
    if is_lumenrl_log(text):
        return "lumenrl"
    raise MetricsError(f"{first}: cannot tell what this is (not a repro run directory, W&B CSV export, LumenRL log "
                       "with 'step=N key=value' lines, or JSONL); prefix the kind: run:, wandb:, lumenrl:, verl:")


def load_source(source: str | os.PathLike | SourceSpec | RunFrames, *, base: Path | None = None,
                data_source: str | None = None, wandb_run: str | None = None) -> RunFrames:
    """The frames of one source (see the module docstring). ``base``: the folder relative paths are read from
    (default: the working directory). ``data_source`` picks the val-core data source, ``wandb_run`` the run of a
    panel export holding several."""
    if isinstance(source, RunFrames):
        return source
    spec = source if isinstance(source, SourceSpec) else parse_source(source)
    paths = _expand(spec, base)
    kind = spec.kind or detect_kind(paths)
    first = paths[0]
    if kind == "run":
        run_dir = first.parent if first.is_file() else first
        return load_run(run_dir, label=spec.label or "")
    label = spec.label or (first.name if first.is_dir() else paths[0].parent.name if len(paths) > 1 else "")
    readers = READERS[kind]
    if first.is_dir():
        csvs = sorted(first.glob("*.csv"))
        if ".csv" not in readers or not csvs:
            raise MetricsError(f"{spec.text}: a folder; {kind} reads files (name the file)")
        paths = csvs
    suffix = paths[0].suffix.lower()
    reader = readers.get(suffix, readers[""])
    if len(paths) > 1 and reader is not _wandb:
        raise MetricsError(f"{spec.text}: matches {len(paths)} files; only W&B exports of one run may be several files")
    return reader(paths, data_source, wandb_run, label)


def load_sources(sources, *, base: Path | None = None, data_source: str | None = None,
                 wandb_run: str | None = None) -> list[RunFrames]:
    """One source or a list of them -> frames in the same order, labels made unique (a repeated label gets
    " (2)", " (3)" ...)."""
    if isinstance(sources, (str, os.PathLike, SourceSpec, RunFrames)):
        sources = [sources]
    sources = list(sources)
    if not sources:
        raise MetricsError("no run source given (a run directory, W&B CSV, LumenRL log or JSONL)")
    loaded = [load_source(s, base=base, data_source=data_source, wandb_run=wandb_run) for s in sources]
    seen: dict[str, int] = {}
    for frames in loaded:
        seen[frames.label] = seen.get(frames.label, 0) + 1
        if seen[frames.label] > 1:
            frames.label = f"{frames.label} ({seen[frames.label]})"
    return loaded


def resolve_source_parameter(value, default) -> list[str]:
    """A notebook's ``source`` parameter as source strings with absolute paths: left at its default, each path is
    the project's (JupyterLab starts kernels in notebooks/); typed by a person, it is taken from the working
    directory (repro.paths). Labels and kind prefixes are kept."""
    values = [value] if isinstance(value, (str, os.PathLike)) else list(value)
    at_default = value == default
    out = []
    for item in values:
        spec = parse_source(item) if not Path(os.fspath(item)).expanduser().is_absolute() else None
        if spec is None:
            out.append(os.fspath(item))
            continue
        path = resolve_parameter(spec.path, spec.path if at_default else None)
        prefix = (f"{spec.label}=" if spec.label else "") + (f"{spec.kind}:" if spec.kind else "")
        out.append(prefix + str(path))
    return out


def describe(frames: RunFrames) -> str:
    """One line: label, kind, path, steps and evaluations."""
    steps = frames.train.index
    span = f"steps {int(steps.min())}-{int(steps.max())}" if len(steps) else "no steps"
    evals = ", ".join(str(int(s)) for s in frames.eval.index) or "none"
    what = frames.recipe.name if frames.recipe is not None else frames.kind
    return (f"{frames.label:<16} {what:<10} {frames.source}  ({len(steps)} training rows, {span}; "
            f"evaluations at: {evals})")


def default_output_dir(sources: list[RunFrames]) -> Path:
    """Where outputs go when not told: the first source's run directory for a repro run, else runs/compare/ of the
    project (an export's folder is someone else's)."""
    first = sources[0]
    if first.kind == "repro" and first.recipe is not None:
        return first.source.parent
    return project_path("runs/compare")
