"""Notebook 01 runs top to bottom with papermill on small parameters and records the numbers it shows.
(Committed without outputs and with one parameters cell: tests/test_notebooks.py checks every notebook.)"""

import sys

import pytest

from repro.notebooks import execute_notebook, notebook_parameters

NAME = "01_fp8_conversion"


def test_papermill_sees_every_parameter():
    params = notebook_parameters(NAME)
    assert set(params) == {"input_dir", "output_dir", "fmt", "workers", "pow2_scale"}
    assert params["fmt"]["default"] == '"e4m3fn"' and params["workers"]["inferred_type_name"] == "int"


@pytest.mark.slow
def test_notebook_runs_and_records_results(tmp_path):
    results = execute_notebook(NAME, tmp_path, {"input_dir": "", "output_dir": str(tmp_path), "fmt": "e4m3fnuz"})
    assert results["kernel_python"] == sys.executable  # the venv's interpreter ran it, no global kernel
    assert results["format"] == "e4m3fnuz" and results["shards"] == 5
    assert results["tensors"] == 210 and results["tensors_fp8"] == 130 and results["tensors_kept"] == 80
    assert results["verified_fp8_tensors"] == 130 and results["verified_all_finite"] and results["kept_identical"]
    assert results["rel_error_bound"] == pytest.approx(0.0628, abs=1e-4)
    assert 0.02 < results["rel_error_median"] < results["rel_error_max"] < results["rel_error_bound"]
    assert results["verified_rel_error_max"] == pytest.approx(results["rel_error_max"], rel=1e-3)
    assert 0.5 < results["size_ratio"] < 0.6
    assert (tmp_path / "01_fp8_error_histogram.png").stat().st_size > 10_000
    assert (tmp_path / "fp8-e4m3fnuz" / "config.json").is_file()
    assert (tmp_path / f"{NAME}.ipynb").is_file()  # the executed copy, beside the results


@pytest.mark.slow
def test_the_plain_papermill_command_runs_it_from_notebooks_with_the_kernel_it_names(tmp_path):
    """What a user types (the README's `.venv/bin/papermill notebooks/X.ipynb out.ipynb -p ...`), here from
    notebooks/, where JupyterLab starts kernels: no -k, so the notebook's own kernel `repro` must exist -- `make
    install` / `make test` / `make repro` install it (before, only `make lab` did: NoSuchKernel on a fresh clone)."""
    import json
    import subprocess
    from pathlib import Path

    import repro

    papermill = Path(sys.executable).with_name("papermill")
    executed = tmp_path / "executed.ipynb"
    proc = subprocess.run([str(papermill), f"{NAME}.ipynb", str(executed), "-p", "input_dir", "",
                           "-p", "output_dir", str(tmp_path), "-p", "fmt", "e4m3fn"],
                          cwd=repro.REPO_DIR / "notebooks", capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"papermill failed (run `make install` first?):\n{proc.stderr[-3000:]}"
    assert json.loads(executed.read_text())["metadata"]["kernelspec"]["name"] == "repro"
    results = json.loads((tmp_path / f"{NAME}.results.json").read_text())
    assert Path(results["kernel_python"]).resolve() == Path(sys.executable).resolve()
    assert results["format"] == "e4m3fn" and results["tensors_fp8"] == 130 and results["verified_all_finite"]
    assert (tmp_path / "fp8-e4m3fn" / "config.json").is_file()
