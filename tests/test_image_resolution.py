"""Would `pip install repro` change AMD's image? pip's own resolver answers, from metadata alone, offline.

AMD's images (LumenRL `examples/GRPO/Dockerfile.dsv4`, both targets) are `vllm/vllm-openai-rocm:v0.25.1` plus
`ray[default]==2.56.1` and `transformers>=5.0` (which keeps the base's transformers). What they hold, and how each
version was found, is in docs/amd-images.md: Python 3.12, torch `2.11.0+gitd0c8b1f` (a ROCm source build), vLLM
0.25.1, Ray 2.56.1, transformers 5.13.1 with tokenizers 0.22.2.

The seam tested is our side only: our metadata against those versions. Stand-ins, said plainly:
- the image is a throwaway venv holding metadata-only ``.dist-info`` folders for those five packages, each carrying
  the real Requires-Dist lines (read from their published metadata) that name one of repro's dependencies;
- a local find-links folder offers metadata-only wheels: repro (Name, Version, Requires-Python, Requires-Dist copied
  from pyproject.toml), every dependency at the laptop lock's version -- so pip *could* replace the image's torch,
  transformers, tokenizers and Ray with newer ones -- and, for the dependencies the image does not model, also at
  their range's floor.
pip then runs for real (`install --dry-run --report`, `--python-version 3.12`, `--no-index`, no config files) with the
image's packages requested next to repro, so vLLM's own pins (torch==2.11.0, transformers>=5.5.3) are checked too.
Nothing is downloaded; a run takes a few seconds. Not modelled: the image's other packages (numpy, pydantic, pandas,
... are offered, not installed) and environment markers for 3.12 (pip evaluates them for the interpreter it runs on;
no marker in the stand-ins differs between 3.11 and 3.12).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from repro import REPO_DIR

IMAGE_PYTHON = "3.12"
# name -> (version, Requires-Dist lines that bear on repro's dependencies, Provides-Extra)
IMAGE = {
    # torch's other requirements (filelock, sympy, networkx, jinja2, fsspec, ...) name none of repro's dependencies
    "torch": ("2.11.0+gitd0c8b1f", [], []),
    # vllm 0.25.1's wheel METADATA (it also pins torchaudio/torchvision 2.11-series and needs ~60 serving packages)
    "vllm": ("0.25.1", ["torch==2.11.0", "transformers>=5.5.3", "tokenizers>=0.21.1", "safetensors>=0.6.2",
                        "numpy", "tqdm", "pyyaml", "pydantic>=2.12.0"], []),
    # transformers 5.13.1's METADATA (besides huggingface-hub<2, regex, typer, packaging)
    "transformers": ("5.13.1", ["numpy>=1.17", "pyyaml>=5.1", "tokenizers<=0.23.0,>=0.22.0", "safetensors>=0.8.0",
                                "tqdm>=4.60"], []),
    # the newest tokenizers that transformers 5.13.1 admits (0.23.0 was never released, only 0.23.0rc0)
    "tokenizers": ("0.22.2", [], []),
    # ray 2.56.1's METADATA; LumenRL installs it with [default]
    "ray": ("2.56.1", ["pyyaml", 'pydantic<3,>=2.5.0; python_version < "3.14" and extra == "default"'], ["default"]),
}
LOCK = REPO_DIR / "constraints" / "laptop.txt"


def _metadata(name: str, version: str, requires=(), requires_python: str | None = None, extras=()) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Python: {requires_python}"] if requires_python else []
    lines += [f"Provides-Extra: {extra}" for extra in extras]
    lines += [f"Requires-Dist: {requirement}" for requirement in requires]
    return "\n".join(lines) + "\n"


def _write_wheel(folder: Path, name: str, version: str, **metadata) -> None:
    """A wheel with nothing in it but its .dist-info: enough for pip to resolve, never to import."""
    stem = f"{canonicalize_name(name).replace('-', '_')}-{version}"
    with zipfile.ZipFile(folder / f"{stem}-py3-none-any.whl", "w") as wheel:
        wheel.writestr(f"{stem}.dist-info/METADATA", _metadata(name, version, **metadata))
        wheel.writestr(f"{stem}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: repro-tests\n"
                                                  "Root-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{stem}.dist-info/RECORD", "")


def _install_metadata(site_packages: Path, name: str, version: str, **metadata) -> None:
    """An 'installed' distribution as pip sees one: a .dist-info folder, no code."""
    info = site_packages / f"{canonicalize_name(name).replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(_metadata(name, version, **metadata))
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("")


def _lock() -> dict[str, str]:
    lines = (line.split("#")[0].strip() for line in LOCK.read_text().splitlines())
    return dict(line.split("==") for line in lines if line)


def _floor(requirement: Requirement) -> str:
    return next(s.version for s in requirement.specifier if s.operator == ">=")


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> dict[str, Path]:
    """The image as a venv of metadata, and the local index of stand-in wheels."""
    root = tmp_path_factory.mktemp("image")
    venv.create(root / "venv", with_pip=False)
    site_packages = next((root / "venv" / "lib").glob("python3*/site-packages"))
    for name, (version, requires, extras) in IMAGE.items():
        _install_metadata(site_packages, name, version, requires=requires, extras=extras)
    wheels = root / "wheels"
    wheels.mkdir()
    project = tomllib.loads((REPO_DIR / "pyproject.toml").read_text())["project"]
    offered = {(name, version) for name, version in _lock().items()}
    offered |= {(r.name, _floor(r)) for r in map(Requirement, project["dependencies"]) if r.name not in IMAGE}
    for name, version in sorted(offered):
        _write_wheel(wheels, name, version, extras=["default"] if name == "ray" else [])
    return {"root": root, "python": root / "venv" / "bin" / "python", "wheels": wheels, "project": project}


def _repro_wheel(image, folder: Path, requires_python: str | None = None) -> None:
    project = image["project"]
    _write_wheel(folder, "repro", project["version"], requires=project["dependencies"],
                 requires_python=requires_python or project["requires-python"])


def resolve(image, *pip_args: str, requires_python: str | None = None,
            requested=tuple(IMAGE)) -> tuple[subprocess.CompletedProcess, dict]:
    """pip's plan for `pip install repro <the image's packages>` inside the image; (process, report or {})."""
    links = image["root"] / f"links-{len(list(image['root'].glob('links-*')))}"
    links.mkdir()
    _repro_wheel(image, links, requires_python)
    report = links / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # this machine's pip.conf adds find-links and local indexes: none of those
    command = [sys.executable, "-m", "pip", "--python", str(image["python"]), "install", "--dry-run", "--quiet",
               "--no-index", "--find-links", str(image["wheels"]), "--find-links", str(links),
               "--python-version", IMAGE_PYTHON, "--only-binary=:all:", "--report", str(report), *pip_args,
               "repro", *requested]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=180)
    return done, json.loads(report.read_text()) if report.exists() else {}


def _plan(report: dict) -> dict[str, str]:
    return {canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"] for item in report["install"]}


def test_pip_adds_repro_to_the_image_and_changes_none_of_its_packages(image):
    done, report = resolve(image)
    assert done.returncode == 0, done.stderr
    plan = _plan(report)
    print("\nimage:", ", ".join(f"{n} {v}" for n, (v, _, _) in IMAGE.items()), f"(Python {IMAGE_PYTHON})")
    print("pip would install:", ", ".join(f"{n} {v}" for n, v in sorted(plan.items())))
    assert not set(plan) & set(IMAGE), f"pip would replace the image's {sorted(set(plan) & set(IMAGE))}"
    assert plan["repro"] == image["project"]["version"]
    # everything else repro needs comes in beside the image's stack (the image does not model those, see the docstring)
    assert set(plan) == {"repro"} | {Requirement(r).name for r in image["project"]["dependencies"]} - set(IMAGE)


def test_the_laptop_lock_would_replace_the_images_stack(image):
    """The control: the same harness sees a replacement when there is one. The laptop's exact versions must never be
    installed into the image: without vLLM in the request pip would swap torch, transformers, tokenizers and Ray."""
    done, report = resolve(image, "-c", str(LOCK))
    assert done.returncode != 0 and "ResolutionImpossible" in done.stderr  # vLLM's torch==2.11.0 against the lock
    assert "vllm" in done.stderr.lower()
    done, report = resolve(image, "-c", str(LOCK), requested=[name for name in IMAGE if name != "vllm"])
    assert done.returncode == 0, done.stderr
    replaced = {n: v for n, v in _plan(report).items() if n in IMAGE}
    lock = _lock()
    assert replaced == {name: lock[name] for name in IMAGE if name != "vllm"}  # torch 2.13.0, transformers 5.24.0, ...


def test_pip_refuses_the_image_python_under_the_old_requires_python(image):
    done, report = resolve(image, requires_python=">=3.11,<3.12")
    assert done.returncode != 0 and not report
    assert "requires a different Python: 3.12.0 not in '<3.12,>=3.11'" in done.stderr
