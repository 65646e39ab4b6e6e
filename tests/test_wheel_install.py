"""A wheel built from this repository, installed into a fresh venv (not editable, as `pip install .` into AMD's
images), runs the notebook chain from a temporary folder and writes the executed notebooks, the figures and the
report there. Before the notebooks were package data, that install ran nothing, printed "skipped (not in
notebooks/): 00 ... 20" and exited 0; a chain that finds no notebook now fails naming where it looked.

Nothing is downloaded: the wheel is built without build isolation from this venv's setuptools, and the fresh venv
reaches this venv's dependencies through a .pth line. Python adds a .pth line's folder to sys.path without
processing that folder's own .pth files, so the editable install's finder there stays inactive: with PYTHONPATH
unset, the only repro the fresh venv can import is the wheel's (checked). The chain is its smallest form: the full
run (03) of 3 steps on a small batch, in process, then notebooks 10-20 (00, 01 and the smoke run 02 have tests of
their own).
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from repro import REPO_DIR
from repro.analysis.plots import FIGURE_NAMES
from repro.notebooks.catalog import CHAIN

SMALL = ["algorithm.prompts_per_step=4", "algorithm.responses_per_prompt=2", "eval.samples_per_problem=1",
         "eval.at_start=false"]
SKIPPED = ("00_cluster_check", "01_fp8_conversion", "02_smoke_run")
RAN = tuple(name for name in CHAIN if name not in SKIPPED)  # the chain as repro.notebooks.catalog lists it


def _run(command, **kwargs):
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv python, its site-packages, the environment to run it in): the wheel installed into a fresh venv."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"  # what the wheel is built from, copied so that the build leaves nothing in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO_DIR / name, source / name)
    for name in ("repro", "notebooks"):
        shutil.copytree(REPO_DIR / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc",
                                                                                         ".ipynb_checkpoints", "runs"))
    pip_env = {**{k: v for k, v in os.environ.items() if not k.startswith("PIP_")},
               "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--quiet",
          "--wheel-dir", str(root / "dist"), str(source)], env=pip_env, timeout=300)
    wheel = next((root / "dist").glob("repro-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        packaged = {Path(n).name for n in archive.namelist() if n.startswith("repro/notebook_files/")}
    assert packaged == {p.name for p in (REPO_DIR / "notebooks").glob("*.ipynb")}

    venv.create(root / "venv", with_pip=False)
    python = root / "venv" / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # --ignore-installed: pip sees this venv's own repro through the .pth line and must neither skip nor remove it
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "--quiet", str(wheel)],
         env=pip_env, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", RAY_AUTH_MODE="disabled")
    # the borrowed nbconvert's templates (the report page's) live under this venv's prefix, where a real install's own
    # prefix would hold them; only they are lent, through JUPYTER_PATH (this venv's kernel specs are not)
    lent = root / "jupyter-data"
    lent.mkdir()
    (lent / "nbconvert").symlink_to(Path(sys.prefix) / "share" / "jupyter" / "nbconvert")
    env["JUPYTER_PATH"] = str(lent)
    imported = _run([str(python), "-c", "import repro; print(repro.__file__)"], env=env, cwd=root).stdout.strip()
    assert Path(imported) == site / "repro" / "__init__.py"
    return python, site, env


def _installed_files(site: Path) -> set[str]:
    return {str(p.relative_to(site)) for p in (site / "repro").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.mark.long
def test_the_installed_wheel_runs_the_chain_from_a_temporary_folder(installed, tmp_path):
    python, site, env = installed
    record = next(site.glob("repro-*.dist-info")) / "RECORD"
    listed = {line.split(",")[0] for line in record.read_text().splitlines()}
    repro_cli = python.parent / "repro"
    command = [str(repro_cli), "notebooks", "--recipe", "tiny-cpu", "--steps", "3", "--in-process"]
    command += [a for name in SKIPPED for a in ("--skip", name)] + [a for o in SMALL for a in ("--set", o)]
    done = _run(command, cwd=tmp_path, env=env, timeout=900)
    print(done.stdout)
    assert "skipped" not in done.stdout and "KeyboardInterrupt" not in done.stderr

    run_dir, figures = tmp_path / "runs" / "tiny-cpu", tmp_path / "figures"
    results = {name: json.loads((run_dir / "notebooks" / f"{name}.results.json").read_text()) for name in RAN}
    for name in RAN:
        executed = json.loads((run_dir / "notebooks" / f"{name}.ipynb").read_text())
        assert executed["metadata"]["papermill"]["exception"] is None
        assert results[name]["kernel_python"] == str(python)  # the fresh venv ran every notebook
    accuracy = [row["reward/accuracy"] for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
                if row["kind"] == "train"]
    assert len(accuracy) == 3 == results["03_full_run"]["train_rows"]
    assert results["10_reward_by_phase"]["phase_means"]["tiny-cpu"]["1"] == pytest.approx(sum(accuracy) / 3)
    for name in FIGURE_NAMES:
        assert all((figures / f"{name}.{ext}").stat().st_size > 1000 for ext in ("png", "svg")), name
    report = (run_dir / "comparison.md").read_text()
    assert f"{run_dir / 'metrics.jsonl'}` (tiny-cpu): 3 steps (1–3)" in report
    assert results["20_compare_to_amd"]["report"] == str(run_dir / "comparison.md")
    assert _installed_files(site) <= listed  # nothing written into the installed package


@pytest.mark.long
def test_an_install_without_its_notebooks_fails_naming_where_it_looked(installed, tmp_path):
    python, site, env = installed
    packaged = site / "repro" / "notebook_files"
    packaged.rename(site / "repro" / "notebook_files.away")
    try:
        done = subprocess.run([str(python.parent / "repro"), "notebooks", "--steps", "3"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
    finally:
        (site / "repro" / "notebook_files.away").rename(packaged)
    assert done.returncode == 1, done.stdout + done.stderr
    assert ("repro notebooks: error: no notebook of the chain found: looked for 00_cluster_check.ipynb, "
            "01_fp8_conversion.ipynb, 02_smoke_run.ipynb") in done.stderr
    assert f"in {packaged} (an installed repro's) and in {site / 'notebooks'} (a checkout's)" in done.stderr
    assert not (tmp_path / "runs").exists()  # failed before writing anything
