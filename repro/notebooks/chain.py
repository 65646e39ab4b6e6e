"""The notebook chain that `make repro` and `repro notebooks` run."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from repro.cluster.runtime import end_recorded_processes, shared_local_instance
from repro.notebooks.execution import execute_notebook, venv_kernel_name
from repro.notebooks.files import CHECKOUT_NOTEBOOKS, NOTEBOOKS_DIR, PACKAGED_NOTEBOOKS, NotebookError, notebook_path
from repro.notebooks.parameters import notebook_parameters
from repro.notebooks.catalog import CHAIN, WAVES
from repro.run.plan import SMOKE_STEPS

# --------------------------------------------------------------------------------------------- the chain


@dataclass
class ChainResult:
    run_dir: Path
    notebooks_dir: Path
    figures_dir: Path
    report: Path
    page: Path | None = None  # the report page (index.html), the chain's last step; None when there was no run
    page_seconds: float = 0.0
    results: dict[str, dict] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0  # start to end; less than the notebooks' sum when a wave ran side by side

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    def describe(self) -> str:
        lines = [f"notebook chain done in {self.wall_seconds:.0f} s (the notebooks' own times add up to "
                 f"{self.total_seconds:.0f} s). Outputs:",
                 f"  run directory      {self.run_dir} (metrics.jsonl, metrics.parquet, eval/, checkpoints/)",
                 f"  executed notebooks {self.notebooks_dir}/ (<name>.ipynb + <name>.results.json)"]
        lines += [f"    {name:<20} {self.seconds[name]:7.1f} s" for name in self.results]
        lines += [f"  figures            {self.figures_dir}/ (PNG + SVG)",
                  f"  comparison report  {self.report}"]
        if self.page is not None:
            lines.append(f"  report page        {self.page} ({self.page_seconds:.1f} s)")
        if self.skipped:
            lines.append(f"  skipped (not in {NOTEBOOKS_DIR}): {', '.join(self.skipped)}")
        return "\n".join(lines)


def chain_parameters(name: str, run_dir: Path, recipe: str, steps: int | None, overrides: list[str],
                     in_process: bool, figures_dir: Path, notebooks_dir: Path,
                     smoke_dir: Path | None = None) -> tuple[dict, Path | None]:
    """(parameters, results_dir) for one notebook of the chain.

    The chain knows one pool of values; each notebook gets the ones its ``parameters`` cell declares (read from
    the notebook: the cell is the only place a parameter is declared), so a notebook that drops or renames a
    parameter is simply not passed it. Two notebooks see some values differently: the smoke run (02) writes to
    its own throwaway directory for 3 steps, and the FP8 notebook (01) writes under ``<run_dir>/fp8``.
    """
    from repro.recipes import load_recipe  # pydantic: not for `repro notebooks --help`

    pool = {"recipe": recipe, "run_dir": str(run_dir), "source": str(run_dir), "steps": steps or 0,
            "overrides": overrides, "in_process": in_process, "out_dir": str(notebooks_dir),
            "figures_dir": str(figures_dir)}
    results_dir = None
    if name == "02_smoke_run":
        smoke_dir = Path(smoke_dir or run_dir / "smoke")
        # a separate smoke dir is a throwaway, started afresh (fresh=True removes only a smoke run's own files);
        # smoke_dir == run_dir makes the full run continue it
        pool.update(run_dir=str(smoke_dir), steps=SMOKE_STEPS, fresh=smoke_dir != run_dir)
    elif name in ("00_cluster_check", "01_fp8_conversion"):
        results_dir = notebooks_dir if name == "00_cluster_check" else run_dir / "fp8"
        pool.update(out_dir=str(results_dir), output_dir=str(results_dir),
                    fmt=load_recipe(recipe, overrides).rollout.fp8_format)
    declared = notebook_parameters(name)
    return {k: v for k, v in pool.items() if k in declared}, results_dir


def run_chain(run_dir: str | Path, recipe: str = "tiny-cpu", steps: int | None = None, *,
              overrides: Iterable[str] = (), in_process: bool = False, figures_dir: str | Path | None = None,
              notebooks: Iterable[str] | None = None, skip: Iterable[str] = (), smoke_dir: str | Path | None = None,
              parallel: int = 2, log: Callable[[str], None] = print) -> ChainResult:
    """Execute the notebook chain in order (see module docstring) and return where everything is.

    ``steps``/``overrides`` apply to the full run (03); the smoke run (02) is always 3 steps on the same
    recipe and overrides, in ``smoke_dir`` (default ``<run_dir>/smoke``, the earlier smoke run's files removed
    first; ``smoke_dir=run_dir`` makes the full run resume from the smoke run's step 3 instead of starting over).
    ``notebooks`` limits the chain to those names (kept in chain order), ``skip`` drops some. ``parallel``
    notebooks of one wave run at a time (1: strictly in order); the local Ray instance the runs share starts while
    the first wave runs. A re-run resumes the full run from its newest checkpoint.
    """
    if parallel < 1:
        raise NotebookError(f"parallel must be at least 1, got {parallel}")
    started = time.perf_counter()
    # absolute before they reach a notebook: the kernel resolves a relative path against its own folder, and a path
    # equal to a notebook's default against the project root, neither of which need be this working directory
    run_dir = Path(run_dir).absolute()
    overrides = list(overrides)
    figures_dir = Path(figures_dir).absolute() if figures_dir else run_dir / "figures"
    notebooks_dir = run_dir / "notebooks"
    wanted = set(CHAIN if notebooks is None else notebooks) - set(skip)
    unknown = wanted - set(CHAIN)
    if unknown:
        raise NotebookError(f"not in the chain: {', '.join(sorted(unknown))} (chain: {', '.join(CHAIN)})")
    result = ChainResult(run_dir, notebooks_dir, figures_dir, run_dir / "comparison.md")
    if wanted and not any(notebook_path(name).is_file() for name in wanted):
        raise NotebookError(
            f"no notebook of the chain found: looked for {', '.join(n + '.ipynb' for n in CHAIN if n in wanted)} in "
            f"{PACKAGED_NOTEBOOKS} (an installed repro's) and in {CHECKOUT_NOTEBOOKS} (a checkout's); reinstall "
            "repro, or run it from a checkout")
    log(f"warm start: {ensure_model(recipe, overrides)}")
    kernel = venv_kernel_name()
    waves = [[name for name in wave if name in wanted and _present(name, result, log)] for wave in WAVES]
    run = _WaveRunner(result, dict(run_dir=run_dir, recipe=recipe, steps=steps, overrides=overrides,
                                   in_process=in_process, figures_dir=figures_dir, notebooks_dir=notebooks_dir,
                                   smoke_dir=Path(smoke_dir) if smoke_dir else None), kernel, log)
    with ExitStack() as stack, ThreadPoolExecutor(max_workers=parallel) as pool:
        first = [pool.submit(run.one, name) for name in waves[0]]
        if not in_process and wanted & {"02_smoke_run", "03_full_run"}:
            _share_one_ray_instance(stack, run_dir, recipe, overrides, log)
        run.finish(waves[0], first)
        if waves[0] and "00_cluster_check" in result.results and result.results["00_cluster_check"].get("failed"):
            raise NotebookError(f"notebook 00_cluster_check: the cluster is not ready for recipe {recipe}: "
                                f"{result.results['00_cluster_check'].get('summary', 'a check failed')} "
                                f"(see {notebooks_dir / '00_cluster_check.ipynb'}); the chain stops before the runs")
        for wave in waves[1:]:
            if len(wave) == 1 or parallel == 1:  # in this thread: a Ctrl-C reaches papermill at once, as before
                for name in wave:
                    run.one(name)
            else:
                run.finish(wave, [pool.submit(run.one, name) for name in wave])
    result.results = {name: result.results[name] for name in CHAIN if name in result.results}
    write_page(result, log)
    result.wall_seconds = time.perf_counter() - started
    return result


def write_page(result: ChainResult, log: Callable[[str], None]) -> None:
    """The chain's last step: the run's report page, from its log and the notebooks just executed. A chain that
    left no run (``--only 00_cluster_check``) has nothing to report and says so."""
    from repro.analysis.frame import METRICS_FILE  # pandas, matplotlib: only for the page at the chain's end
    from repro.report_page import REPORT_DIR, write_report_page

    if not (result.run_dir / METRICS_FILE).is_file():
        log(f"[report] skipped: no {METRICS_FILE} in {result.run_dir}")
        return
    started = time.perf_counter()
    result.page = write_report_page(result.run_dir, result.run_dir / REPORT_DIR)
    result.page_seconds = time.perf_counter() - started
    log(f"[report] done in {result.page_seconds:.1f} s -> {result.page}")


def _present(name: str, result: ChainResult, log: Callable[[str], None]) -> bool:
    if notebook_path(name).is_file():
        return True
    log(f"[{name}] skipped: {notebook_path(name)} not found")
    result.skipped.append(name)
    return False


def _share_one_ray_instance(stack: ExitStack, run_dir: Path, recipe: str, overrides: list[str],
                            log: Callable[[str], None]) -> None:
    """Start the local Ray instance the smoke and full runs join (and end what a killed chain left of one)."""
    from repro.recipes import load_recipe

    record = run_dir / "logs" / "ray_processes.chain.json"
    end_recorded_processes(record)
    shared = stack.enter_context(shared_local_instance(load_recipe(recipe, overrides), record))
    if shared is not None:
        log(f"one local Ray instance for the chain's runs: {shared.address} (started in {shared.connect_s:.1f} s)")


@dataclass
class _WaveRunner:
    result: ChainResult
    pool_values: dict
    kernel: str
    log: Callable[[str], None]

    def one(self, name: str) -> None:
        v = self.pool_values
        params, results_dir = chain_parameters(name, v["run_dir"], v["recipe"], v["steps"], v["overrides"],
                                               v["in_process"], v["figures_dir"], v["notebooks_dir"], v["smoke_dir"])
        self.log(f"[{name}] running ...")
        started = time.perf_counter()
        self.result.results[name] = execute_notebook(name, v["notebooks_dir"], params, results_dir=results_dir,
                                                     kernel_name=self.kernel)
        self.result.seconds[name] = time.perf_counter() - started
        self.log(f"[{name}] done in {self.result.seconds[name]:.1f} s -> {v['notebooks_dir'] / (name + '.ipynb')}")

    def finish(self, wave: list[str], futures: list) -> None:
        """Wait for every notebook of the wave; then raise the first failure in chain order (the others of the
        wave were let finish, so their outputs are whole)."""
        errors = [future.exception() for future in futures]
        failed = [(name, err) for name, err in zip(wave, errors) if err is not None]
        if failed:
            for name, err in failed[1:]:
                self.log(f"[{name}] also failed: {err}")
            raise failed[0][1]


def ensure_model(recipe: str, overrides: Iterable[str] = ()) -> str:
    """The warm-started tiny checkpoint the recipe runs from, regenerated if missing (`make repro`'s first step)."""
    from repro.recipes import load_recipe
    from repro.run.run_dir import resolve_model_dir  # torch, transformers: the driver needs them only here

    return str(resolve_model_dir(load_recipe(recipe, list(overrides))))


