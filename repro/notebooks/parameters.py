"""A notebook's parameters: declared once, in its `parameters` cell; checked and resolved by its first call."""

from __future__ import annotations

from typing import Any, Iterable

from repro.analysis.frame import RunFrames
from repro.analysis.sources import describe, load_sources, resolve_source_parameter
from repro.notebooks.files import NotebookError, notebook_path
from repro.paths import resolve_parameter

# --------------------------------------------------------------------------------------------- parameters

PATH_SUFFIXES = ("_dir", "_path", "_file")
INJECTED_MARKER = "# Parameters"  # the first line of the cell papermill injects after the parameters cell


def notebook_parameters(name: str) -> dict:
    """The notebook's ``parameters`` cell: {name: {default, help, ...}} (papermill's inspection)."""
    import papermill as pm

    path = notebook_path(name)
    if not path.is_file():
        raise NotebookError(f"notebook {name}: {path} not found")
    return pm.inspect_notebook(str(path))


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


def notebook_sources(name: str, value, *, quiet: bool = False, **options) -> list[RunFrames]:
    """What an analysis notebook's first cell calls after ``notebook_setup``: its ``source`` parameter (one source
    or a list) resolved as ``notebook_setup`` resolves paths, loaded, and each printed with what it holds."""
    resolved = resolve_source_parameter(value, declared_parameters(name).get("source"))
    loaded = load_sources(resolved, **options)
    if not quiet:
        for frames in loaded:
            print(describe(frames))
    return loaded
