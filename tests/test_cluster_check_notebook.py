"""Notebook 00 runs top to bottom with papermill on the tiny recipe and records the checks it shows."""

import json
import sys
from pathlib import Path

import pytest

import repro

NOTEBOOK = repro.REPO_DIR / "notebooks" / "00_cluster_check.ipynb"


def test_notebook_is_committed_without_outputs():
    nb = json.loads(NOTEBOOK.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code)
    params = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1 and "recipe =" in "".join(params[0]["source"]) and \
        "out_dir =" in "".join(params[0]["source"])


@pytest.mark.slow
def test_notebook_runs_on_the_tiny_recipe_and_records_results(tmp_path):
    import papermill as pm

    executed = tmp_path / "00_cluster_check.ipynb"
    pm.execute_notebook(str(NOTEBOOK), str(executed), parameters={"recipe": "tiny-cpu", "out_dir": str(tmp_path)},
                        kernel_name="python3", cwd=str(repro.REPO_DIR), progress_bar=False)
    results = json.loads((tmp_path / "00_cluster_check.results.json").read_text())
    # the kernel is this interpreter (the venv's), not some other python3 registered globally
    assert Path(results["python"]).resolve() == Path(sys.executable).resolve() == \
        Path(results["kernel_python"]).resolve()
    assert results["recipe"] == "tiny-cpu" and results["cpu_mode"] is True and results["failed"] is False
    assert results["expected_gpus"] == 0 and "CPU mode" in results["summary"]
    status = {row["check"]: row["status"] for row in results["checks"]}
    assert status["gpu_count"] == status["accelerator"] == status["rdma"] == "SKIP"
    assert status["ray"] == status["torch"] == status["disk"] == "PASS"
    assert "FAIL" not in status.values()
    assert [set(row) for row in results["checks"]] == [{"check", "status", "detail", "fix"}] * len(status)
    shown = json.loads(executed.read_text())
    assert any("gpu_count" in json.dumps(c.get("outputs")) for c in shown["cells"] if c["cell_type"] == "code")
