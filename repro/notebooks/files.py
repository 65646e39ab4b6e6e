"""Where the notebooks are, and the error every notebook step raises: the lowest of the notebook modules
(``parameters`` and ``execution`` both build on it)."""

from __future__ import annotations

from pathlib import Path

import repro
from repro.errors import ReproError

# Where the notebooks are: installed with the package (a wheel carries notebooks/ as repro/notebook_files/, see
# setup.py), else the checkout's notebooks/ (a checkout or an editable install, where JupyterLab edits them).
PACKAGED_NOTEBOOKS = repro.PACKAGE_DIR / "notebook_files"
CHECKOUT_NOTEBOOKS = repro.REPO_DIR / "notebooks"
NOTEBOOKS_DIR = PACKAGED_NOTEBOOKS if PACKAGED_NOTEBOOKS.is_dir() else CHECKOUT_NOTEBOOKS


class NotebookError(ReproError):
    """A notebook is missing, failed in a cell, or did not record its results."""


def notebook_path(name: str) -> Path:
    return NOTEBOOKS_DIR / f"{name}.ipynb"
