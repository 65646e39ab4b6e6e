"""The notebook suite: run notebooks with papermill, record what each one found, and chain them.

Each notebook under ``notebooks/`` is a thin walkthrough: a ``parameters`` cell, then calls into ``repro``
(every computation lives here or in ``repro.analysis``, figures in ``repro.analysis.plots``), tables, figures, and a
last cell that calls :func:`record_results`. The recorded JSON sits beside the executed notebook
(``<out_dir>/<name>.results.json``) so a test, the chain or a reader can check the numbers without parsing
notebook outputs.

The notebooks, their kinds and the chain's waves are listed once, in ``repro.notebooks.catalog``. The chain
(``repro notebooks``, ``make repro``) writes the executed notebooks to ``<run_dir>/notebooks/``, the figures (PNG +
SVG) to ``figures_dir`` and the report to ``<run_dir>/comparison.md``, and last the report page
``<run_dir>/report/index.html`` (repro.report_page). A notebook missing from ``notebooks/`` is skipped with a note,
and a chain that finds none of its notebooks fails naming where it looked (a wheel carries them as package data,
``repro/notebook_files/``, see setup.py); a failing one stops the chain with a :class:`NotebookError` naming the
notebook and the cell.

Modules: ``catalog`` (every notebook, once), ``files`` (where the notebooks are, NotebookError), ``execution``
(papermill, recorded results, the kernel), ``parameters`` (each notebook's first call: its parameters checked and
its paths resolved), ``chain`` (the chain ``make repro`` runs).
"""

from repro.notebooks.catalog import ANALYSIS, CHAIN, NOTEBOOKS, RUNS, WAVES, Notebook, notebook_named
from repro.notebooks.chain import ChainResult, chain_parameters, ensure_model, run_chain
from repro.notebooks.execution import (
    RESULTS_SUFFIX, execute_notebook, load_results, record_results, results_path, venv_kernel_name,
)
from repro.notebooks.files import NOTEBOOKS_DIR, NotebookError, notebook_path
from repro.notebooks.parameters import (
    check_parameters, declared_parameters, injected_parameter_names, is_path_parameter, notebook_parameters,
    notebook_setup, notebook_sources,
)

__all__ = [
    "ANALYSIS", "CHAIN", "NOTEBOOKS", "NOTEBOOKS_DIR", "RESULTS_SUFFIX", "RUNS", "WAVES", "ChainResult", "Notebook",
    "NotebookError", "chain_parameters", "check_parameters", "declared_parameters", "ensure_model",
    "execute_notebook", "injected_parameter_names", "is_path_parameter", "load_results", "notebook_named",
    "notebook_parameters", "notebook_path", "notebook_setup", "notebook_sources", "record_results", "results_path",
    "run_chain", "venv_kernel_name",
]
