"""The two README commands and the pins: environment.yml agrees with pyproject, CI calls `make test`."""

import re
import tomllib

import yaml

from repro import REPO_DIR


def _pyproject():
    return tomllib.loads((REPO_DIR / "pyproject.toml").read_text())


def test_environment_yml_agrees_with_pyproject():
    project = _pyproject()["project"]
    env = yaml.safe_load((REPO_DIR / "environment.yml").read_text())
    assert "python=3.11" in env["dependencies"]
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-e ." in pip_section
    pins = sorted(p for p in pip_section if p != "-e .")
    assert pins == sorted(project["dependencies"] + project["optional-dependencies"]["dev"])


def test_every_dependency_is_pinned_exactly():
    project = _pyproject()["project"]
    for requirement in project["dependencies"] + project["optional-dependencies"]["dev"]:
        assert re.fullmatch(r"[A-Za-z0-9_.\-]+(\[[a-z,]+\])?==[0-9][0-9A-Za-z.+]*", requirement), requirement
    assert "torch==2.13.0" in project["dependencies"]
    assert project["requires-python"] == ">=3.11,<3.12"


def test_installed_versions_match_the_pins():
    from importlib.metadata import version

    for requirement in _pyproject()["project"]["dependencies"]:
        name, pinned = re.sub(r"\[.*\]", "", requirement).split("==")
        assert version(name).split("+")[0] == pinned, name


def test_readme_commands_and_ci():
    readme = (REPO_DIR / "README.md").read_text()
    assert "make repro" in readme and "make test" in readme
    assert "make test" in (REPO_DIR / ".ci" / "run").read_text()
    makefile = (REPO_DIR / "Makefile").read_text()
    for target in ("repro:", "test:", "lab:", "install:"):
        assert f"\n{target}" in makefile
    assert "-m venv" in makefile
