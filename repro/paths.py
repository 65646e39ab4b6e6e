"""Where a path parameter points, whoever started the process.

JupyterLab starts a notebook's kernel in ``notebooks/``; papermill (``make repro``, the tests) and the CLI start
from the repository root. A default such as ``runs/tiny-cpu`` is written once, in the notebook's parameters
cell or the command's option, and means the project's ``runs/tiny-cpu`` wherever the process started. A path
a person typed means what paths mean everywhere else: relative to the working directory they are in.

An installed repro (a wheel in site-packages, as in AMD's images) has no project around it: its defaults are taken
from the working directory, never from site-packages (``project_root``).
"""

from __future__ import annotations

import os
from pathlib import Path

from repro import REPO_DIR


def project_root() -> Path:
    """The checkout's root (REPO_DIR holds pyproject.toml: a checkout, an editable install); for an installed
    repro, whose REPO_DIR is site-packages, the working directory (the chain starts its kernels there)."""
    return REPO_DIR if (REPO_DIR / "pyproject.toml").is_file() else Path.cwd()


def project_path(value: str | os.PathLike) -> Path:
    """``value`` against the project root (absolute paths and ``~`` are kept as they are), normalised."""
    path = Path(value).expanduser()
    return Path(os.path.normpath(path if path.is_absolute() else project_root() / path))


def resolve_parameter(value: str | os.PathLike | None, default: str | os.PathLike | None) -> Path | None:
    """A path parameter's absolute path: left at its declared ``default`` it is taken from the project root,
    anything else from the working directory. Empty (``""`` or None) stays None: the caller derives it."""
    if value is None or str(value) == "":
        return None
    if default is not None and str(value) == str(default):
        return project_path(value)
    # normalised: "../runs/x" typed in JupyterLab (kernel in notebooks/) reads back as <root>/runs/x, not
    # <root>/notebooks/../runs/x, in the printed paths, the recorded results and the report
    return Path(os.path.abspath(Path(value).expanduser()))
