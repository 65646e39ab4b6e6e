"""What repro may replace, empty or write: only what it provably made, never what it reads, never through a link.

Every command that writes a folder (``repro report --out``, ``repro convert --output --overwrite``, a fresh run)
builds the new one aside and renames it in. A folder already at that name is replaced only when

- it carries the project's own marker (a report's ``.repro-report.json``, a conversion's ``fp8_conversion.json``,
  a built model's ``.repro-model.json``; a run folder is emptied only by ``fresh``: repro.run.folder), and
- it is not a source the command reads, a folder holding one, or a run folder (its metrics, recipe, checkpoints).

Otherwise the command refuses with one line naming the folder and the flag that sends the output elsewhere; nothing
is touched. Files inside a folder the project writes are created without following links (``O_NOFOLLOW``), so a
link planted there (a folder copied, untarred or shared from someone else) is refused, naming it, instead of
overwriting whatever it points at.

Hand-written: the standard library has the pieces (``os.open`` flags, ``Path.resolve``) but no policy.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Callable, Iterable

from repro.errors import ReproError

RUN_MARKERS = ("metrics.jsonl", "recipe.yaml")  # a run folder holds its log and its resolved recipe


class NotOurs(ReproError):
    """A folder or file the command would replace, empty or write through is not provably the project's."""


def is_run_folder(folder: Path) -> bool:
    """A repro run folder: it holds a run's log or resolved recipe."""
    return any((Path(folder) / name).is_file() for name in RUN_MARKERS)


def overlap(out: Path, source: Path) -> str | None:
    """How ``out`` lies against ``source`` (real locations, links resolved): "is" (the same), "holds" (a parent
    of it), "inside" (within it), or None (apart)."""
    o, s = Path(out).resolve(), Path(source).resolve()
    if o == s:
        return "is"
    if o in s.parents:
        return "holds"
    if s in o.parents:
        return "inside"
    return None


def check_apart(out: Path, sources: Iterable[Path], flag: str, *, inside_ok: bool = False) -> None:
    """Refuse an output that is a source, holds one, or (unless ``inside_ok``) lies inside one."""
    words = {"is": "is the input", "holds": "holds the input", "inside": "lies inside the input"}
    for source in sources:
        how = overlap(out, source)
        if how is not None and not (how == "inside" and inside_ok):
            raise NotOurs(f"{out}: {words[how]} {source}; nothing was written: {flag}")


def check_replaceable(folder: Path, *, ours: Callable[[Path], bool], what: str, marker: str, flag: str,
                      sources: Iterable[Path] = (), inside_ok: bool = False) -> None:
    """Raise NotOurs unless the existing ``folder`` (if any) may be replaced by a new ``what``: it is the
    project's (``ours``; ``marker`` names the file that shows it), apart from the sources, and not a run."""
    folder = Path(folder)
    if folder.is_symlink():
        raise NotOurs(f"{folder}: a link; a {what} is never written through one: {flag}")
    check_apart(folder, sources, flag, inside_ok=inside_ok)
    if not folder.exists():
        return
    if not folder.is_dir():
        raise NotOurs(f"{folder}: exists and is not a folder; nothing was replaced: {flag}")
    if is_run_folder(folder):
        held = ", ".join(n for n in RUN_MARKERS if (folder / n).is_file())
        raise NotOurs(f"{folder}: a run folder ({held}), not a {what}; nothing was replaced: {flag}")
    if any(folder.iterdir()) and not ours(folder):
        raise NotOurs(f"{folder}: exists and is not a {what} repro wrote (no {marker}); nothing was replaced: {flag}")


def open_no_follow(path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` that never follows a link at ``path`` (the folders above it are the user's choice); a link
    there is refused, naming it."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError as err:
        if err.errno == errno.ELOOP or (err.errno == errno.EEXIST and Path(path).is_symlink()):
            raise NotOurs(f"{path}: a link (to {os.readlink(path)}); repro writes its own files there, never "
                          "through a link: remove the link, or choose another folder") from None
        raise


def write_atomic(path: Path, data: bytes | str) -> Path:
    """Write ``path`` whole or not at all: a fresh temp file beside it (created, never opened through a link),
    fsynced, then renamed over ``path`` (a rename replaces a link itself, never what it points at)."""
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(path.name + ".tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()  # a temp file a killed writer left (a link is removed itself, its target untouched)
    fd = open_no_follow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def links_leaving(folder: Path, skip: Iterable[str] = ()) -> list[Path]:
    """Links under ``folder`` (not followed) that point outside it: writing through one would change a file the
    folder does not hold. Links within it are its own; top-level entries named in ``skip`` are not looked into
    (another program's folder: W&B links its debug logs to ~/.cache and writes them itself)."""
    root = Path(folder).resolve()
    found = []
    for top, dirs, files in os.walk(folder):
        if Path(top) == Path(folder):
            dirs[:] = [d for d in dirs if d not in skip or (Path(top) / d).is_symlink()]
        for name in dirs + files:
            path = Path(top) / name
            if path.is_symlink():
                target = path.resolve()
                if target != root and root not in target.parents:
                    found.append(path)
    return sorted(found)


def check_no_links_out(folder: Path, what: str, flag: str, skip: Iterable[str] = ()) -> None:
    """Refuse a ``what`` folder holding a link that leaves it, naming the first (``skip``: see links_leaving)."""
    leaving = links_leaving(folder, skip)
    if leaving:
        more = f" (and {len(leaving) - 1} more)" if len(leaving) > 1 else ""
        raise NotOurs(f"{leaving[0]}: a link out of the {what} (to {os.readlink(leaving[0])}){more}; repro writes "
                      f"its {what} only through its own files: replace the link by what it points at, or {flag}")


def single_component(name: str) -> str | None:
    """Why ``name`` cannot be one folder's name (None when it can)."""
    if not name or name.strip() != name:
        return "empty or padded with spaces"
    if name in (".", "..") or any(c in name for c in "/\\\0"):
        return "must be a single folder name (no '/', '\\', '..' or '.')"
    return None
