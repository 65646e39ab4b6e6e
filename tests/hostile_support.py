"""Shared by tests/test_hostile_input.py and tests/test_hostile_runs.py: a tree's bytes, a command's one line."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from repro.cli import main


def tree(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (``root`` itself included), links not followed: a folder, a link's target, or
    a file's SHA-256. Equal before and after: not one byte the user owned changed, nothing added or removed."""
    root = Path(root)
    out = {}
    if not root.exists() and not root.is_symlink():
        return out
    for top, dirs, files in os.walk(root):
        for name in ["."] if Path(top) == root else []:
            out[name] = "dir"
        for name in dirs + files:
            path = Path(top) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                out[rel] = "link:" + os.readlink(path)
            elif path.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def refused(capsys, *argv: str) -> str:
    """Run ``repro ARGV`` in this process; assert it exited 1 with its error on stderr and no traceback; return
    the message (one line, except a recipe's validation, which lists a field per line under its heading)."""
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "Traceback" not in err
    start = err.index(f"repro {argv[0]}: error: ")  # a warning of the reader may come first
    return err[start:].removeprefix(f"repro {argv[0]}: error: ").rstrip("\n")


def usage_error(capsys, *argv: str) -> str:
    """``repro ARGV`` refused by argparse: exit code 2 and its one error line."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err
    return err.strip().splitlines()[-1]


def ok(capsys, *argv: str) -> str:
    """``repro ARGV`` succeeded (exit code 0); what it printed (stdout, then stderr)."""
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return out.out + out.err


def user_folder(path: Path) -> Path:
    """A folder of the user's: a thesis and a notes file, nothing repro made."""
    path.mkdir(parents=True)
    (path / "thesis.tex").write_text("\\documentclass{article}\n")
    (path / "notes.md").write_text("# notes\n")
    return path
