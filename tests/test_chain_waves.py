"""The chain's scheduling: notebooks of one wave side by side, waves in order, a failure raised after its wave.

The notebooks themselves are replaced by a recorder here (test_notebooks.py executes the real ones)."""

from __future__ import annotations

import threading
import time

import pytest

from repro.notebooks import CHAIN, NotebookError
from repro.notebooks import chain as chain_module
from repro.notebooks.chain import WAVES, run_chain


def _recording_executor(monkeypatch, fail: str | None = None):
    spans, lock = {}, threading.Lock()

    def execute(name, out_dir, params, results_dir=None, kernel_name=None):
        start = time.perf_counter()
        time.sleep(0.3)
        with lock:
            spans[name] = (start, time.perf_counter())
        if name == fail:
            raise NotebookError(f"notebook {name}: cell 2 failed")
        return {"name": name}

    monkeypatch.setattr(chain_module, "execute_notebook", execute)
    return spans


def _overlap(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_waves_run_in_order_and_their_notebooks_side_by_side(monkeypatch, tmp_path):
    spans = _recording_executor(monkeypatch)
    result = run_chain(tmp_path, "tiny-cpu", 2, in_process=True, parallel=2, log=lambda line: None)
    assert list(result.results) == list(CHAIN) and set(spans) == set(CHAIN)
    for earlier, later in zip(WAVES, WAVES[1:]):
        assert max(spans[n][1] for n in earlier) <= min(spans[n][0] for n in later)
    assert _overlap(spans["00_cluster_check"], spans["01_fp8_conversion"])
    analysis = WAVES[-1]
    running_at_each_start = [sum(spans[b][0] <= spans[a][0] < spans[b][1] for b in analysis) for a in analysis]
    assert max(running_at_each_start) == 2  # two at a time, never three
    first_start, last_end = min(s for s, _ in spans.values()), max(e for _, e in spans.values())
    assert last_end - first_start < result.total_seconds - 0.5 and result.wall_seconds >= last_end - first_start
    assert "notebooks' own times add up to" in result.describe()


def test_one_at_a_time_when_parallel_is_1(monkeypatch, tmp_path):
    spans = _recording_executor(monkeypatch)
    run_chain(tmp_path, "tiny-cpu", 2, in_process=True, parallel=1, log=lambda line: None)
    ordered = sorted(spans, key=lambda n: spans[n][0])
    assert ordered == list(CHAIN)
    assert not any(_overlap(spans[a], spans[b]) for a, b in zip(ordered, ordered[1:]))
    with pytest.raises(NotebookError, match="parallel must be at least 1"):
        run_chain(tmp_path, parallel=0, log=lambda line: None)


def test_a_failure_is_raised_after_its_wave_and_stops_the_next(monkeypatch, tmp_path):
    spans = _recording_executor(monkeypatch, fail="01_fp8_conversion")
    lines = []
    with pytest.raises(NotebookError, match="01_fp8_conversion: cell 2 failed"):
        run_chain(tmp_path, "tiny-cpu", 2, in_process=True, log=lines.append)
    assert set(spans) == {"00_cluster_check", "01_fp8_conversion"}  # 00 finished; 02 never started
    assert "[00_cluster_check] done in" in "\n".join(lines)


def test_the_report_page_is_the_chains_last_step(monkeypatch, tmp_path):
    from repro.analysis.synthetic import write_synthetic_run

    spans = _recording_executor(monkeypatch)
    run_dir = write_synthetic_run(tmp_path / "run", steps=10, seed=1)  # what 03 leaves; the recorder writes nothing
    lines = []
    result = run_chain(run_dir, "tiny-cpu", 2, in_process=True, notebooks=["20_compare_to_amd"], log=lines.append)
    assert set(spans) == {"20_compare_to_amd"}
    assert result.page == run_dir / "report" / "index.html" and result.page.is_file()
    assert lines[-1] == f"[report] done in {result.page_seconds:.1f} s -> {result.page}"
    assert f"report page        {result.page}" in result.describe()
    assert "tiny-cpu: comparison with AMD" in result.page.read_text()

    lines.clear()  # a chain that made no run (00 alone) has no page to write, and says so
    result = run_chain(tmp_path / "empty", "tiny-cpu", 2, in_process=True, notebooks=["00_cluster_check"],
                       log=lines.append)
    assert result.page is None and lines[-1] == f"[report] skipped: no metrics.jsonl in {tmp_path / 'empty'}"
    assert "report page" not in result.describe()
