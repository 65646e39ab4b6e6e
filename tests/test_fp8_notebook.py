"""Notebook 01 runs top to bottom with papermill on small parameters and records the numbers it shows."""

import json
import sys
from pathlib import Path

import pytest

import repro

NOTEBOOK = repro.REPO_DIR / "notebooks" / "01_fp8_conversion.ipynb"


def test_notebook_is_committed_without_outputs():
    nb = json.loads(NOTEBOOK.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code)
    assert sum("parameters" in c.get("metadata", {}).get("tags", []) for c in code) == 1


@pytest.mark.slow
def test_notebook_runs_and_records_results(tmp_path):
    import papermill as pm

    executed = tmp_path / "01_fp8_conversion.ipynb"
    pm.execute_notebook(
        str(NOTEBOOK), str(executed),
        parameters={"input_dir": "", "output_dir": str(tmp_path), "fmt": "e4m3fnuz", "workers": 1},
        kernel_name="python3", cwd=str(repro.REPO_DIR), progress_bar=False,
    )
    results = json.loads((tmp_path / "01_fp8_conversion.results.json").read_text())
    # the kernel is this interpreter (the venv's), not some other python3 registered globally
    assert Path(results["python"]).resolve() == Path(sys.executable).resolve()
    assert results["format"] == "e4m3fnuz"
    assert results["tensors"] == 210 and results["tensors_fp8"] == 130 and results["tensors_kept"] == 80
    assert results["verified_fp8_tensors"] == 130 and results["verified_all_finite"] and results["kept_identical"]
    assert results["rel_error_bound"] == pytest.approx(0.0628, abs=1e-4)
    assert 0.02 < results["rel_error_median"] < results["rel_error_max"] < results["rel_error_bound"]
    assert results["verified_rel_error_max"] == pytest.approx(results["rel_error_max"], rel=1e-3)
    assert 0.5 < results["size_ratio"] < 0.6
    assert (tmp_path / "01_fp8_error_histogram.png").stat().st_size > 10_000
    assert (tmp_path / "fp8-e4m3fnuz" / "config.json").exists()
    executed_nb = json.loads(executed.read_text())
    assert any(c.get("outputs") for c in executed_nb["cells"] if c["cell_type"] == "code")
