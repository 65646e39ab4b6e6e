"""What a notebook says about the run comes from the recipe it runs: the schedule is written by
repro.recipes.describe, and no markdown cell states a schedule of its own (03's opening said 'at step 0 and every 25
steps' -- tiny-cpu's -- while AMD's recipe evaluates after step 1 and every 5)."""

import json
import re
from pathlib import Path

import pytest

from repro.recipes import load_recipe
from repro.recipes.describe import schedule

NOTEBOOK_FILES = Path(__file__).resolve().parents[1] / "notebooks"
SCHEDULE_CLAIM = re.compile(r"(at step 0|every \d+ steps|checkpoint every)")


def test_the_schedule_is_said_from_the_recipe():
    assert schedule(load_recipe("tiny-cpu")) == (
        "tiny-cpu: 75 steps; held-out avg@8 at step 0, after step 1, every 25 steps and after the last; "
        "a checkpoint every 25 steps and after the last, the newest 2 kept")
    assert schedule(load_recipe("amd-dsv4-flash-mi308x", ["steps=10", "eval.every_steps=1"])) == (
        "amd-dsv4-flash-mi308x: 10 steps; held-out avg@8 after step 1, after every step and after the last; "
        "a checkpoint every 25 steps and after the last, the newest 2 kept")


@pytest.mark.parametrize("name", ["02_smoke_run", "03_full_run"])
def test_the_run_notebooks_state_no_schedule_of_their_own(name):
    cells = json.loads((NOTEBOOK_FILES / f"{name}.ipynb").read_text())["cells"]
    claims = [m.group(0) for c in cells if c["cell_type"] == "markdown" for m in SCHEDULE_CLAIM.finditer(
        "".join(c["source"]).replace("after step 1 and every 5 steps", ""))]  # AMD's, named as AMD's
    assert claims == []
    code = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert name == "02_smoke_run" or "schedule(resolved)" in code


def test_every_notebook_is_in_the_one_list_and_the_list_names_only_notebooks_that_exist():
    from repro.notebooks.catalog import ANALYSIS, CHAIN, NOTEBOOKS, WAVES


    on_disk = sorted(p.stem for p in NOTEBOOK_FILES.glob("*.ipynb"))
    assert sorted(n.name for n in NOTEBOOKS) == on_disk
    assert CHAIN == ("00_cluster_check", "01_fp8_conversion", "02_smoke_run", "03_full_run", *ANALYSIS)
    assert WAVES[-1] == ANALYSIS and all(n.kind == "study" for n in NOTEBOOKS if n.name not in CHAIN)
