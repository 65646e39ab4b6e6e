"""The browser lane (``make test-lab``): a small run, JupyterLab as `make lab` starts it, Debian's Chromium.

Runs only where Playwright for Python is installed (``make test-lab`` builds .venv-lab with it); elsewhere every
test here is skipped with that reason. Chromium missing where Playwright is installed is an error, not a skip.
JupyterLab and Chromium are ended in teardown, also when a test failed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import secrets
import shutil
from pathlib import Path

import pytest

from repro import REPO_DIR

PLAYWRIGHT_INSTALLED = importlib.util.find_spec("playwright") is not None
SKIP_REASON = ("Playwright is not installed in this venv (by design: the main .venv has no browser driver); "
               "`make test-lab` builds .venv-lab with it and runs these tests in Debian's Chromium")
CHROMIUM = Path(os.environ.get("REPRO_LAB_CHROMIUM", "/usr/bin/chromium"))
# the run and everything the lane keeps (screenshots, executed results, JupyterLab's log) live here, inside the
# project's git-ignored runs/, so a person finds them after the lane; the marker file makes it safe to clear
RUN_DIR = Path(os.environ.get("REPRO_LAB_RUN_DIR", REPO_DIR / "runs" / "lab-test")).absolute()
MARKER = "made-by-make-test-lab.txt"
# a small run that still has GRPO groups, evaluations at steps 0, 2 and 3, and a checkpoint: ~40 s on 2 busy cores
SMALL_RUN = ["steps=3", "algorithm.prompts_per_step=4", "algorithm.responses_per_prompt=2",
             "eval.samples_per_problem=1", "eval.every_steps=2", "checkpoint.every_steps=100",
             "lengths.max_response=12"]


def pytest_collection_modifyitems(config, items):
    if PLAYWRIGHT_INSTALLED:
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(skip)


def fresh_lane_dir(path: Path) -> Path:
    """``path`` emptied, if it is the lane's own (holds the marker) or absent; anything else is refused."""
    if path.exists():
        if not (path / MARKER).is_file():
            raise RuntimeError(f"{path} exists and was not made by the browser lane ({MARKER} missing): "
                               f"not deleting it; set REPRO_LAB_RUN_DIR to another folder")
        shutil.rmtree(path)
    path.mkdir(parents=True)
    (path / MARKER).write_text("made by `make test-lab` (tests/lab); deleted and remade by its next run\n")
    return path


@pytest.fixture(scope="session")
def lane_dir():
    return fresh_lane_dir(RUN_DIR)


def lane_processes(lane: Path) -> list[str]:
    """Processes the lane may have left: this process's descendants (Playwright's driver, Chromium, JupyterLab)
    and any whose command line names the lane's folder (kernels, started in their own sessions, are found by their
    connection file under the lane's runtime folder). Read from /proc: no broad name matching."""
    parents, commands = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid = int(stat.parent.name)
            parents[pid] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            commands[pid] = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
    me, left = os.getpid(), []
    for pid, command in commands.items():
        ancestor = parents.get(pid)
        while ancestor not in (None, 0, 1, me):
            ancestor = parents.get(ancestor)
        if pid != me and (ancestor == me or str(lane) in command):
            left.append(f"{pid}: {command.strip()[:160]}")
    return left


@pytest.fixture(scope="session", autouse=True)
def nothing_left_running():
    """Set up first, torn down last: after JupyterLab and Chromium are ended, none of their processes remain."""
    yield
    import time

    deadline = time.monotonic() + 20
    while (left := lane_processes(RUN_DIR)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, "the browser lane left processes running:\n" + "\n".join(left)


@pytest.fixture(scope="session")
def small_run(lane_dir):
    """A 3-step tiny-cpu run, in process (no Ray): what the analysis notebooks read."""
    import torch

    from repro.recipes import load_recipe
    from repro.engines import run_recipe

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model's ops are too small for a second OpenMP thread on 2 busy cores
    try:
        run_recipe(load_recipe("tiny-cpu", SMALL_RUN), lane_dir / "run", in_process=True, say=lambda line: None)
    finally:
        torch.set_num_threads(threads)
    return lane_dir / "run"


def notebook_digests() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((REPO_DIR / "notebooks").glob("*.ipynb"))}


@pytest.fixture(scope="session")
def lab(lane_dir):
    """JupyterLab on 127.0.0.1 with the project kernel, started in notebooks/ as `make lab` does; stopped after."""
    from lab_server import start_lab

    before = notebook_digests()
    server = start_lab(lane_dir / "jupyter", token=secrets.token_hex(16))
    try:
        yield server
    finally:
        server.stop()
    changed = [name for name, digest in notebook_digests().items() if before.get(name) != digest]
    assert not changed, f"the browser session changed committed notebooks: {changed}"


@pytest.fixture(scope="session")
def browser():
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} not found: `make test-lab` installs Debian's chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser, lab):
    """A browser page of its own; the kernels it started are shut down after."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    try:
        yield page
    finally:
        context.close()
        lab.shut_down_kernels()
