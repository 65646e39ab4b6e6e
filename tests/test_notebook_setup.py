"""Notebook parameters: defaults resolve from the project root wherever the kernel starts; a typed path from the
working directory; parameters a notebook does not declare are refused by name."""

from pathlib import Path

import pytest

import repro
from repro.notebooks import NotebookError, check_parameters, injected_parameter_names, notebook_setup
from repro.paths import resolve_parameter


def test_a_default_path_resolves_against_the_project_root_from_any_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_parameter("runs/tiny-cpu", "runs/tiny-cpu") == repro.REPO_DIR / "runs" / "tiny-cpu"
    assert resolve_parameter("runs/other", "runs/tiny-cpu") == tmp_path / "runs" / "other"
    assert resolve_parameter("/abs/x", "runs/tiny-cpu") == Path("/abs/x")
    assert resolve_parameter("", "") is None


def test_a_typed_path_that_climbs_out_of_notebooks_reads_back_normalised(monkeypatch):
    """What a person types in JupyterLab (kernel in notebooks/) to reach the project's runs: ../runs/x is
    <root>/runs/x in every printed path and recorded result (found by the browser lane, tests/lab)."""
    monkeypatch.chdir(repro.REPO_DIR / "notebooks")
    assert str(resolve_parameter("../runs/x", "runs/tiny-cpu")) == str(repro.REPO_DIR / "runs" / "x")
    assert str(resolve_parameter("runs/../runs/tiny-cpu", "runs/../runs/tiny-cpu")) == str(
        repro.REPO_DIR / "runs" / "tiny-cpu")


def test_papermill_injected_names_are_read_from_the_kernel_history_without_executing_them():
    history = ["", 'run_dir = "runs/tiny-cpu"\nphase_len = 25', '# Parameters\nstpes = 1\nrun_dir = "x"\n',
               "import os"]
    assert injected_parameter_names(history) == ["stpes", "run_dir"]


def test_an_undeclared_parameter_is_refused_naming_it_and_the_nearest_declared_one():
    with pytest.raises(NotebookError, match=r"unknown parameter\(s\) stpes \(did you mean steps\?\)"):
        check_parameters("02_smoke_run", ["stpes"], ["recipe", "run_dir", "steps"])


def test_notebook_setup_resolves_the_declared_defaults_and_refuses_injected_strangers(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(repro.REPO_DIR / "notebooks")  # where JupyterLab starts the kernel
    params = notebook_setup("10_reward_by_phase", {"In": [""], "source": "runs/tiny-cpu", "report": "x"})
    assert params.source == "runs/tiny-cpu"  # a run source, resolved by repro.analysis.sources (tests/test_sources.py)
    assert params.out_dir is None and params.phase_len == 25
    params = notebook_setup("20_compare_to_amd", {"In": [""], "report": "out/comparison.md"})
    assert params.report == repro.REPO_DIR / "notebooks" / "out" / "comparison.md"  # typed: from the working directory
    assert str(repro.REPO_DIR / "notebooks" / "out" / "comparison.md") in capsys.readouterr().out
    with pytest.raises(NotebookError, match=r"unknown parameter\(s\) run_dir \(did you mean"):
        notebook_setup("10_reward_by_phase", {"In": ["# Parameters\nrun_dir = 'x'\n"]})
