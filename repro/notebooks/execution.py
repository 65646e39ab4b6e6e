"""Executing a notebook with papermill and reading back what it recorded."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import sys
from pathlib import Path
from typing import Any

from repro.errors import ReproError
from repro.notebooks.files import NotebookError, notebook_path
from repro.notebooks.parameters import check_parameters
from repro.paths import project_root

RESULTS_SUFFIX = ".results.json"


# --------------------------------------------------------------------------------------------- recording


def _jsonable(value: Any) -> Any:
    """Plain JSON: numpy/pandas scalars become Python numbers, NaN/inf become null, paths become strings."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):  # numpy arrays and scalars
        return _jsonable(value.tolist())
    if hasattr(value, "to_dict"):  # pandas Series / DataFrame
        return _jsonable(value.to_dict())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def results_path(name: str, out_dir: str | Path) -> Path:
    return Path(out_dir) / f"{name}{RESULTS_SUFFIX}"


def record_results(name: str, results: dict, out_dir: str | Path) -> Path:
    """Write ``<out_dir>/<name>.results.json`` atomically (temp file, fsync, rename) and return its path.

    Values are made plain JSON (numpy numbers -> Python, NaN -> null); ``kernel_python`` (the interpreter
    that ran the notebook) is added so a caller can check the notebook ran in the project's environment.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    final = results_path(name, out_dir)
    payload = _jsonable({**results, "notebook": name, "kernel_python": sys.executable})
    tmp = final.with_name(f".{final.name}.tmp")
    try:
        with open(tmp, "w") as fh:
            json.dump(payload, fh, indent=2, sort_keys=False, allow_nan=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final


def load_results(name: str, out_dir: str | Path) -> dict:
    path = results_path(name, out_dir)
    if not path.is_file():
        raise NotebookError(f"notebook {name}: ran, but recorded no results ({path} is missing)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise NotebookError(f"notebook {name}: results file {path} is not valid JSON ({err.msg})") from None


# --------------------------------------------------------------------------------------------- execution


def venv_kernel_name() -> str:
    """The kernel name that starts this interpreter (the venv's python) under papermill.

    jupyter_client replaces a kernelspec's ``argv[0]`` of ``python``/``python3`` with ``sys.executable`` of the
    launching process, so ipykernel's default ``python3`` spec runs the venv's python when papermill runs
    from the venv. A spec whose argv[0] is an absolute path is used only if it is this interpreter (e.g. the
    ``repro`` spec ``make lab`` installs); otherwise another python would run the notebook, which is refused.
    """
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    manager = KernelSpecManager()
    me = Path(sys.executable)
    generic = {"python", f"python{sys.version_info[0]}", f"python{sys.version_info[0]}.{sys.version_info[1]}"}
    candidates = ["python3"] + sorted(n for n in manager.find_kernel_specs() if n != "python3")
    for name in candidates:
        try:
            spec = manager.get_kernel_spec(name)
        except NoSuchKernel:
            continue
        exe = spec.argv[0] if spec.argv else ""
        if spec.language.lower() != "python":
            continue
        if exe in generic:
            return name
        try:
            if Path(exe).resolve() == me.resolve() or Path(exe).absolute() == me.absolute():
                return name
        except OSError:
            continue
    raise NotebookError(
        f"no Jupyter kernel starts {sys.executable}: install one with "
        f"`{sys.executable} -m ipykernel install --sys-prefix --name repro`"
    )


def execute_notebook(name: str, out_dir: str | Path, parameters: dict | None = None, *,
                     results_dir: str | Path | None = None, kernel_name: str | None = None,
                     cwd: str | Path | None = None, log_output: bool = False) -> dict:
    """Execute ``notebooks/<name>.ipynb`` with papermill into ``<out_dir>/<name>.ipynb``; return its results.

    The notebook must record ``<name>.results.json`` in ``out_dir`` (or in ``results_dir``, for notebooks
    that write their results where their other outputs go; the file is then copied beside the executed
    notebook). A failing cell raises NotebookError naming the notebook, the cell and the executed copy
    that holds the traceback; stale results from an earlier execution are removed first.
    """
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError
    from traitlets.config import Config

    from repro.notebooks.kernel import ReproKernelManager  # imports jupyter_client: only to execute

    source = notebook_path(name)
    if not source.is_file():
        raise NotebookError(f"notebook {name}: {source} not found")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    executed = out_dir / f"{name}.ipynb"
    check_parameters(name, (parameters or {}).keys())
    where = [out_dir] + ([Path(results_dir)] if results_dir else [])
    for folder in where:
        results_path(name, folder).unlink(missing_ok=True)
    ipc_dir = tempfile.mkdtemp(prefix="repro-kernel-")
    try:
        pm.execute_notebook(
            str(source), str(executed), parameters=_jsonable(parameters or {}),
            kernel_name=kernel_name or venv_kernel_name(), cwd=str(cwd or project_root()),
            progress_bar=False, log_output=log_output, kernel_manager_class=ReproKernelManager,
            # the kernel talks to us over local IPC sockets, not TCP on an open port (and ipykernel then does not
            # warn, once per notebook, that TCP is unencrypted); sockets in a folder of its own, as jupyter_client
            # numbers them from a fixed name and two notebooks may run side by side (the chain's waves)
            config=Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(ipc_dir, "kernel")}}),
        )
    except PapermillExecutionError as err:
        first = (err.source or "").strip().splitlines()
        raise NotebookError(
            f"notebook {name}: cell {err.cell_index} (execution count {err.exec_count}) failed: "
            f"{err.ename}: {err.evalue}\n  cell starts: {first[0] if first else ''!r}\n"
            f"  executed copy with the traceback: {executed}"
        ) from None
    except ReproError:
        raise
    except Exception as err:  # kernel death, missing kernel, unreadable notebook
        raise NotebookError(f"notebook {name}: papermill could not execute it: {type(err).__name__}: {err}") from err
    finally:
        shutil.rmtree(ipc_dir, ignore_errors=True)
    beside = results_path(name, out_dir)
    if not beside.is_file() and results_dir and results_path(name, results_dir).is_file():
        tmp = beside.with_name(f".{beside.name}.tmp")
        tmp.write_bytes(results_path(name, results_dir).read_bytes())
        os.replace(tmp, beside)
    return load_results(name, out_dir)


