"""The notebook suite: run notebooks with papermill, record what each one found, and chain them.

Each notebook under ``notebooks/`` is a thin walkthrough: a ``parameters`` cell, then calls into ``repro``
(every computation lives here or in ``repro.analysis`` / ``repro.plots``), tables, figures, and a last cell
that calls :func:`record_results`. The recorded JSON sits beside the executed notebook
(``<out_dir>/<name>.results.json``) so a test, the chain or a reader can check the numbers without parsing
notebook outputs.

The chain (``repro notebooks``, ``make repro``)::

    00_cluster_check -> 01_fp8_conversion -> 02_smoke_run -> 03_full_run
        -> 10_reward_by_phase -> 11_aime -> 12_throughput -> 13_kl_ess -> 20_compare_to_amd

writes the executed notebooks to ``<run_dir>/notebooks/``, the figures (PNG + SVG) to ``figures_dir`` and
the report to ``<run_dir>/comparison.md``. A notebook missing from ``notebooks/`` is skipped with a note; a
failing one stops the chain with a :class:`NotebookError` naming the notebook and the cell.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import repro
from repro.errors import ReproError

NOTEBOOKS_DIR = repro.REPO_DIR / "notebooks"
CHAIN = ("00_cluster_check", "01_fp8_conversion", "02_smoke_run", "03_full_run", "10_reward_by_phase",
         "11_aime", "12_throughput", "13_kl_ess", "20_compare_to_amd")
RESULTS_SUFFIX = ".results.json"
SMOKE_STEPS = 3


class NotebookError(ReproError):
    """A notebook is missing, failed in a cell, or did not record its results."""


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


# --------------------------------------------------------------------------------------------- parameters

PATH_SUFFIXES = ("_dir", "_path", "_file")
INJECTED_MARKER = "# Parameters"  # the first line of the cell papermill injects after the parameters cell


def declared_parameters(name: str) -> dict[str, Any]:
    """The notebook's ``parameters`` cell as {name: default value} (read with ``ast``: nothing is executed)."""
    import ast

    return {key: ast.literal_eval(info["default"]) for key, info in notebook_parameters(name).items()}


def injected_parameter_names(history: Iterable[str]) -> list[str]:
    """Names papermill assigned in its injected cell(s), found in the kernel's input history (``In``)."""
    import ast

    names = []
    for source in history:
        if not source.lstrip().startswith(INJECTED_MARKER):
            continue
        for node in ast.parse(source).body:
            if isinstance(node, ast.Assign):
                names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


def check_parameters(name: str, given: Iterable[str], declared: Iterable[str] | None = None) -> None:
    """Refuse parameters the notebook does not declare, naming them and the ones it does."""
    declared = list(declared if declared is not None else notebook_parameters(name))
    unknown = sorted(set(given) - set(declared))
    if unknown:
        import difflib

        hints = [f"{u} (did you mean {', '.join(difflib.get_close_matches(u, declared, n=2))}?)"
                 if difflib.get_close_matches(u, declared, n=2) else u for u in unknown]
        raise NotebookError(f"notebook {name}: unknown parameter(s) {', '.join(hints)}; "
                            f"it declares: {', '.join(declared)}")


def is_path_parameter(key: str) -> bool:
    return key.endswith(PATH_SUFFIXES) or key == "report"


def notebook_setup(name: str, namespace: dict, *, quiet: bool = False):
    """The first call of every notebook, right after its parameters cell.

    Refuses parameters papermill injected that the notebook does not declare; resolves every path parameter
    (``*_dir``, ``*_path``, ``*_file``, ``report``) to an absolute path -- left at its default, against the
    project root (so JupyterLab, whose kernel starts in ``notebooks/``, and papermill, which starts at the
    root, read and write the same folders); typed by a person, against the working directory -- and prints
    the paths it uses. Returns the parameters as attributes (an empty path parameter is None: derive it).
    """
    from types import SimpleNamespace

    from repro.paths import resolve_parameter

    declared = declared_parameters(name)
    check_parameters(name, injected_parameter_names(namespace.get("In", [])), declared)
    values = {}
    for key, default in declared.items():
        value = namespace.get(key, default)
        values[key] = resolve_parameter(value, default) if is_path_parameter(key) else value
    if not quiet:
        for key, value in values.items():
            if is_path_parameter(key) and value is not None:
                print(f"{key:<12} {value}")
    return SimpleNamespace(**values)


# --------------------------------------------------------------------------------------------- execution


def notebook_path(name: str) -> Path:
    return NOTEBOOKS_DIR / f"{name}.ipynb"


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


def notebook_parameters(name: str) -> dict:
    """The notebook's ``parameters`` cell: {name: {default, help, ...}} (papermill's inspection)."""
    import papermill as pm

    path = notebook_path(name)
    if not path.is_file():
        raise NotebookError(f"notebook {name}: {path} not found")
    return pm.inspect_notebook(str(path))


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
    try:
        pm.execute_notebook(
            str(source), str(executed), parameters=_jsonable(parameters or {}),
            kernel_name=kernel_name or venv_kernel_name(), cwd=str(cwd or repro.REPO_DIR),
            progress_bar=False, log_output=log_output,
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
    beside = results_path(name, out_dir)
    if not beside.is_file() and results_dir and results_path(name, results_dir).is_file():
        tmp = beside.with_name(f".{beside.name}.tmp")
        tmp.write_bytes(results_path(name, results_dir).read_bytes())
        os.replace(tmp, beside)
    return load_results(name, out_dir)


# --------------------------------------------------------------------------------------------- the chain


@dataclass
class ChainResult:
    run_dir: Path
    notebooks_dir: Path
    figures_dir: Path
    report: Path
    results: dict[str, dict] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    def describe(self) -> str:
        lines = [f"notebook chain done in {self.total_seconds:.0f} s. Outputs:",
                 f"  run directory      {self.run_dir} (metrics.jsonl, metrics.parquet, eval/, checkpoints/)",
                 f"  executed notebooks {self.notebooks_dir}/ (<name>.ipynb + <name>.results.json)"]
        lines += [f"    {name:<20} {self.seconds[name]:7.1f} s" for name in self.results]
        lines += [f"  figures            {self.figures_dir}/ (PNG + SVG)",
                  f"  comparison report  {self.report}"]
        if self.skipped:
            lines.append(f"  skipped (not in notebooks/): {', '.join(self.skipped)}")
        return "\n".join(lines)


def chain_parameters(name: str, run_dir: Path, recipe: str, steps: int | None, overrides: list[str],
                     in_process: bool, figures_dir: Path, notebooks_dir: Path,
                     smoke_dir: Path | None = None) -> tuple[dict, Path | None]:
    """(parameters, results_dir) for one notebook of the chain.

    Our notebooks share one vocabulary (recipe, run_dir, out_dir, figures_dir, steps, overrides,
    in_process). 00/01 are written by others: they get whatever of a common pool their ``parameters`` cell
    declares (output_dir, fmt ...), so a renamed parameter there is simply not passed.
    """
    from repro.recipes import load_recipe

    if name == "02_smoke_run":
        smoke_dir = Path(smoke_dir or run_dir / "smoke")
        # a separate smoke dir is a throwaway, started afresh; smoke_dir == run_dir makes the full run continue it
        return {"recipe": recipe, "run_dir": str(smoke_dir), "steps": SMOKE_STEPS, "overrides": overrides,
                "in_process": in_process, "out_dir": str(notebooks_dir), "fresh": smoke_dir != run_dir}, None
    if name == "03_full_run":
        return {"recipe": recipe, "run_dir": str(run_dir), "steps": steps or 0, "overrides": overrides,
                "in_process": in_process, "out_dir": str(notebooks_dir)}, None
    if name in ("10_reward_by_phase", "11_aime", "12_throughput", "13_kl_ess", "20_compare_to_amd"):
        return {"source": str(run_dir), "out_dir": str(notebooks_dir), "figures_dir": str(figures_dir)}, None
    declared = notebook_parameters(name)
    resolved = load_recipe(recipe, overrides)
    own_out = notebooks_dir if name != "01_fp8_conversion" else run_dir / "fp8"
    pool = {"recipe": recipe, "run_dir": str(run_dir), "output_dir": str(own_out), "out_dir": str(own_out),
            "fmt": resolved.rollout.fp8_format, "overrides": overrides, "in_process": in_process}
    return {k: v for k, v in pool.items() if k in declared}, own_out


def run_chain(run_dir: str | Path, recipe: str = "tiny-cpu", steps: int | None = None, *,
              overrides: Iterable[str] = (), in_process: bool = False, figures_dir: str | Path | None = None,
              notebooks: Iterable[str] | None = None, skip: Iterable[str] = (), smoke_dir: str | Path | None = None,
              log: Callable[[str], None] = print) -> ChainResult:
    """Execute the notebook chain in order (see module docstring) and return where everything is.

    ``steps``/``overrides`` apply to the full run (03); the smoke run (02) is always 3 steps on the same
    recipe and overrides, in ``smoke_dir`` (default ``<run_dir>/smoke``, deleted first; ``smoke_dir=run_dir``
    makes the full run resume from the smoke run's step 3 instead of starting over). ``notebooks`` limits the chain to those names (kept in
    chain order), ``skip`` drops some. A re-run resumes the full run from its newest checkpoint.
    """
    run_dir = Path(run_dir)
    overrides = list(overrides)
    figures_dir = Path(figures_dir) if figures_dir else run_dir / "figures"
    notebooks_dir = run_dir / "notebooks"
    wanted = set(CHAIN if notebooks is None else notebooks) - set(skip)
    unknown = wanted - set(CHAIN)
    if unknown:
        raise NotebookError(f"not in the chain: {', '.join(sorted(unknown))} (chain: {', '.join(CHAIN)})")
    result = ChainResult(run_dir, notebooks_dir, figures_dir, run_dir / "comparison.md")
    log(f"warm start: {ensure_model(recipe, overrides)}")
    kernel = venv_kernel_name()
    for name in CHAIN:
        if name not in wanted:
            continue
        if not notebook_path(name).is_file():
            log(f"[{name}] skipped: {notebook_path(name)} not found")
            result.skipped.append(name)
            continue
        params, results_dir = chain_parameters(name, run_dir, recipe, steps, overrides, in_process, figures_dir,
                                               notebooks_dir, Path(smoke_dir) if smoke_dir else None)
        log(f"[{name}] running ...")
        started = time.perf_counter()
        result.results[name] = execute_notebook(name, notebooks_dir, params, results_dir=results_dir,
                                                kernel_name=kernel)
        result.seconds[name] = time.perf_counter() - started
        log(f"[{name}] done in {result.seconds[name]:.1f} s -> {notebooks_dir / (name + '.ipynb')}")
        if name == "00_cluster_check" and result.results[name].get("failed"):
            raise NotebookError(f"notebook {name}: the cluster is not ready for recipe {recipe}: "
                                f"{result.results[name].get('summary', 'a check failed')} "
                                f"(see {notebooks_dir / (name + '.ipynb')}); the chain stops before the runs")
    return result


def ensure_model(recipe: str, overrides: Iterable[str] = ()) -> str:
    """The warm-started tiny checkpoint the recipe runs from, regenerated if missing (`make repro`'s first step)."""
    from repro.recipes import load_recipe
    from repro.run.run_dir import resolve_model_dir

    return str(resolve_model_dir(load_recipe(recipe, list(overrides))))


# The run helpers notebooks 02/03 call live in repro.run.notebook_runs; re-exported so notebooks import one module.
from repro.run.notebook_runs import LivePlot, run_recipe, train_rows  # noqa: E402,F401
