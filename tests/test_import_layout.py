"""The package's own import graph, read from the source with ``ast`` (nothing imported): no import cycles, and the
two engines side by side -- repro's own (run/, recipes/) imports nothing of LumenRL's (lumenrl/).

Every import counts, inside a function too (an import hidden in a function still closes a cycle when it runs);
only ``if TYPE_CHECKING:`` blocks, which never run, are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import repro

PACKAGE = Path(repro.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("repro",) + path.relative_to(PACKAGE).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imported(module: str, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> list[str]:
    """The package's modules ``node`` imports: ``from a import b`` is module a.b when that is one, else a."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if modules[module].name == "__init__.py" else module.split(".")[:-1]
            base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    found = []
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.append(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        never_run = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                     and "TYPE_CHECKING" in ast.unparse(block.test) for n in ast.walk(block)}
        graph[module] = {target for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                         and id(node) not in never_run for target in _imported(module, node, modules)}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle_and_only_that():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_package_has_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 100 and "repro.engines" in graph["repro.commands.run"]  # the graph is the real one
    assert cycles(graph) == []


def test_our_engine_and_the_recipes_import_nothing_of_lumenrl():
    graph = import_graph()
    ours = [m for m in graph if m.startswith(("repro.run", "repro.recipes"))]
    assert len(ours) > 10
    assert {m: sorted(t for t in graph[m] if t.startswith(("repro.lumenrl", "repro.verl"))) for m in ours
            if any(t.startswith(("repro.lumenrl", "repro.verl")) for t in graph[m])} == {}


def test_engines_are_one_table_row_each_and_import_nothing_of_each_other():
    """The engine table names each engine's seam by string; nothing else imports an engine package: not the run
    entry point, not the launch command, not the analysis, and no engine another."""
    from repro.engine_seam import EngineSeam, load_seam
    from repro.recipes.backends import ENGINES

    graph = import_graph()
    packages = {name: entry.seam.partition(":")[0].rsplit(".", 1)[0] for name, entry in ENGINES.items()}
    assert {"repro", "lumenrl", "verl"} <= set(packages)  # each engine's package is named after it
    assert all(p == ("repro.run" if name == "repro" else f"repro.{name}") for name, p in packages.items())
    assert all(isinstance(load_seam(name), EngineSeam) for name in ENGINES)
    engines_own = tuple(p for p in packages.values() if p != "repro.run")  # our own loop's package is repro.run
    outside = [m for m in graph if not m.startswith(engines_own)]
    assert {m: sorted(t for t in graph[m] if t.startswith(engines_own)) for m in outside
            if any(t.startswith(engines_own) for t in graph[m])} == {}
    for package in engines_own:
        others = tuple(p for p in engines_own if p != package)
        assert [m for m in graph if m.startswith(package) and any(t.startswith(others) for t in graph[m])] == []


def test_the_ray_layer_stands_on_errors_alone_and_the_checks_stand_on_it():
    """cluster/ is the Ray layer the groups use; `repro check` (readiness/) and the launch (run/launch.py) sit above
    it, so the groups never import the checks by way of the Ray layer. The one arrow from the checks into the trainer
    is the cpu_bf16 row asking the trainer's own choice of BF16 GEMM path (repro.train.bf16_gemm), so the check
    says what the trainer will do; that module imports no check."""
    graph = import_graph()
    cluster = {m for m in graph if m.split(".")[:2] == ["repro", "cluster"]}
    assert cluster == {"repro.cluster", "repro.cluster.placement", "repro.cluster.runtime"}
    assert set().union(*(graph[m] for m in cluster)) - cluster == {"repro.errors"}
    readiness = {m for m in graph if m.split(".")[:2] == ["repro", "readiness"]}
    assert len(readiness) == 8
    assert set().union(*(graph[m] for m in readiness)) - readiness == {
        "repro.cluster.placement", "repro.cluster.runtime", "repro.recipes.backends", "repro.recipes.consistency",
        "repro.train.bf16_gemm"}
    assert not any(t.startswith("repro.readiness") for t in graph["repro.train.bf16_gemm"])
    launch = {"repro.cluster.placement", "repro.cluster.runtime", "repro.readiness.memory_budget"}
    assert launch <= graph["repro.run.launch"]
