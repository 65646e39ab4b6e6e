"""Wrong and hostile input as a new user gives it (issue 39), the commands that write folders and read logs: each
case asserts the exit code, the one line, and that every byte the user owned is unchanged (``tree`` before and
after); the good cases beside them must stay good. The run cases (resume, links, checkpoints) are in
tests/test_hostile_runs.py.

Stand-ins, said plainly: the run folders here are synthetic (repro.analysis.synthetic: a resolved recipe.yaml and
a metrics.jsonl as a run appends them, no checkpoints), enough for report, compare and fresh, which read only
those; the BF16 checkpoint converted is the shipped tiny warm start copied to a temp folder. The commands run in
this process through ``repro.cli.main``, as the console script calls it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hostile_support import ok, refused, tree, usage_error, user_folder

from repro import PACKAGE_DIR
from repro.analysis.synthetic import write_synthetic_run
from repro.engines import run_recipe
from repro.recipes import load_recipe
from repro.run.folder import clear_for_fresh

TINY = PACKAGE_DIR / "assets" / "tiny-dsv4-warm"


@pytest.fixture
def space(tmp_path):
    """runs/run (a synthetic 75-step run: AMD's length) beside the user's own folder ``mine``."""
    run = write_synthetic_run(tmp_path / "runs" / "run", steps=75, eval_every=25)
    return run, user_folder(tmp_path / "mine")


# --------------------------------------------------------------------------------- report --out, compare --out
@pytest.mark.parametrize("target, line", [
    ("run", "{run}: is the input {run}; nothing was written: name another folder with --out"),
    ("runs", "{runs}: holds the input {run}; nothing was written: name another folder with --out"),
    ("mine", "{mine}: exists and is not a report repro wrote (no .repro-report.json); nothing was replaced: "
             "name another folder with --out"),
    ("link", "{link}: a link; a report is never written through one: name another folder with --out"),
])
def test_report_out_onto_what_it_did_not_write_is_refused(space, capsys, target, line):
    run, mine = space
    (mine.parent / "link").symlink_to(mine)
    paths = {"run": run, "runs": run.parent, "mine": mine, "link": mine.parent / "link"}
    before = tree(mine.parent)
    said = refused(capsys, "report", run, "--out", paths[target])
    assert said == line.format(run=run, runs=run.parent, mine=mine, link=mine.parent / "link")
    assert tree(mine.parent) == before


def test_report_replaces_its_own_report_and_leaves_the_run_as_it_was(space, capsys):
    run, _ = space
    before = tree(run)
    assert "report written to" in ok(capsys, "report", run)
    (run / "report" / "index.html").write_text("older page")
    assert "report written to" in ok(capsys, "report", run)  # a report repro wrote: replaced
    assert "older page" not in (run / "report" / "index.html").read_text()
    assert json.loads((run / "report" / ".repro-report.json").read_text())["written_by"] == "repro report"
    assert {k: v for k, v in tree(run).items() if not k.startswith("report")} == before


def test_compare_out_onto_its_own_log_or_a_users_file_is_refused(space, capsys):
    run, mine = space
    before = tree(mine.parent)
    assert refused(capsys, "compare", run, "--out", run / "metrics.jsonl") == (
        f"{run / 'metrics.jsonl'}: is the input {run / 'metrics.jsonl'}; nothing was written: "
        "name another file with --out")
    assert refused(capsys, "compare", run, "--out", mine / "notes.md").startswith(
        f"{mine / 'notes.md'}: exists and is not a comparison repro wrote")
    assert tree(mine.parent) == before
    assert "report written to" in ok(capsys, "compare", run)  # the good case: RUN/comparison.md, twice
    assert "report written to" in ok(capsys, "compare", run)


# ------------------------------------------------------------------------------------------ convert --output
@pytest.fixture
def bf16(tmp_path):
    folder = tmp_path / "models" / "bf16"
    shutil.copytree(TINY, folder)
    (tmp_path / "models" / "sibling.txt").write_text("another model's notes\n")
    return folder


@pytest.mark.parametrize("where, overwrite, line", [
    ("in", True, "{o}: is the input {i}; nothing was written: name another folder with --output"),
    ("parent", True, "{o}: holds the input {i}; nothing was written: name another folder with --output"),
    ("inside", False, "{o}: lies inside the input {i}; nothing was written: name another folder with --output"),
    ("mine", True, "{o}: exists and is not a converted checkpoint repro wrote (no fp8_conversion.json); nothing was "
                   "replaced: name another folder with --output"),
    ("partial", False, "{o}.partial: exists and is not a conversion repro left (no .run.json); nothing was "
                       "removed: remove it yourself, or name another folder with --output"),
])
def test_convert_never_removes_the_input_or_a_folder_it_did_not_write(bf16, tmp_path, capsys, where, overwrite, line):
    mine = user_folder(tmp_path / "mine")
    user_folder(tmp_path / "out.partial")
    out = {"in": bf16, "parent": bf16.parent, "inside": bf16 / "fp8", "mine": mine, "partial": tmp_path / "out"}[where]
    before = tree(tmp_path)
    said = refused(capsys, "convert", "--input", bf16, "--output", out, "--quiet", *(["--overwrite"] * overwrite))
    assert said == line.format(o=out, i=bf16)
    assert tree(tmp_path) == before


def test_convert_overwrites_only_its_own_earlier_output(bf16, tmp_path, capsys):
    before = tree(bf16.parent)
    ok(capsys, "convert", "--input", bf16, "--output", tmp_path / "fp8", "--quiet")
    ok(capsys, "convert", "--input", bf16, "--output", tmp_path / "fp8", "--quiet", "--overwrite", "--pow2-scales")
    assert json.loads((tmp_path / "fp8" / "fp8_conversion.json").read_text())["options"]["pow2_scale"] is True
    assert tree(bf16.parent) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fp8", "models"]  # no .old or .partial left


def test_build_tiny_replaces_only_a_model_folder_it_wrote(tmp_path, capsys):
    mine = user_folder(tmp_path / "mine")
    before = tree(tmp_path)
    assert refused(capsys, "build-tiny", "--out", mine) == (
        f"{mine}: exists and is not a model folder repro wrote (no .repro-model.json); nothing was replaced: "
        "name another folder with --out")
    assert tree(tmp_path) == before
    ok(capsys, "build-tiny", "--out", tmp_path / "tiny")
    ok(capsys, "build-tiny", "--out", tmp_path / "tiny", "--layout", "hf")  # its own folder: replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "tiny"]


# ------------------------------------------------------------------------------------------------ fresh
def test_fresh_is_off_by_default_in_every_notebook_and_command():
    from repro.commands import notebooks
    from repro.notebooks.parameters import declared_parameters
    import argparse
    import inspect

    assert declared_parameters("02_smoke_run")["fresh"] is False
    parser = argparse.ArgumentParser()
    notebooks.add_arguments(parser)
    assert parser.parse_args([]).fresh is False
    assert inspect.signature(run_recipe).parameters["fresh"].default is False


def test_fresh_refuses_a_users_folder_and_a_real_run_unless_told_delete_run(space, capsys):
    run, mine = space
    before = tree(mine.parent)
    assert refused(capsys, "notebooks", "--fresh", "--run-dir", mine) == (
        f"run dir {mine} is not a run folder (no recipe.yaml or metrics.jsonl; it holds notes.md, thesis.tex); "
        "fresh removed nothing: choose another run dir")
    assert refused(capsys, "notebooks", "--fresh", "--run-dir", run) == (
        f"run dir {run} holds a run of 75 steps, not a smoke run (at most 3); fresh=True removes only a smoke run: "
        "to delete this run say fresh='delete-run' (--fresh delete-run), or choose another run dir")
    with pytest.raises(Exception, match="not a smoke run"):
        run_recipe(load_recipe("tiny-cpu"), run, in_process=True, fresh=True)  # notebook 02 with fresh=True
    assert tree(mine.parent) == before


def test_a_new_run_in_a_users_folder_is_refused_before_anything_is_written(space):
    """The smoke notebook's old case (papermill ... -p run_dir ~/thesis): fresh is off, and a new run does not
    move into a folder holding someone else's files."""
    _, mine = space
    before = tree(mine)
    with pytest.raises(Exception, match=rf"run dir {mine} holds files that are not a run's \(notes.md, thesis.tex\)"):
        run_recipe(load_recipe("tiny-cpu", steps=3), mine, in_process=True)
    assert tree(mine) == before


def test_fresh_says_what_it_removes_first_and_keeps_what_is_not_the_runs(space):
    run, _ = space
    (run / "my-notes.txt").write_text("mine\n")
    (run / "checkpoints").mkdir()
    said = []

    def say(line):
        said.append((line, (run / "metrics.jsonl").exists()))  # spoken while the files are still there

    smoke = write_synthetic_run(run.parent / "smoke", steps=3, eval_every=25)
    clear_for_fresh(smoke, True, say)  # a smoke run: fresh=True is enough
    assert sorted(p.name for p in smoke.iterdir()) == []
    with pytest.raises(Exception, match="not a smoke run"):
        clear_for_fresh(run, True, say)
    clear_for_fresh(run, "delete-run", say)
    assert said[-1][1]
    assert said[-1][0].startswith(f"fresh: removing from {run}: checkpoints/, metrics.jsonl, recipe.yaml")
    assert said[-1][0].endswith("kept (not the run's): my-notes.txt")
    assert sorted(p.name for p in run.iterdir()) == ["my-notes.txt"]


# --------------------------------------------------------------------------------------------- the readers
def _jsonl(path: Path, *rows: str) -> Path:
    path.write_text("".join(r + "\n" for r in rows))
    return path


@pytest.mark.parametrize("rows, line", [
    (['{"step": 1, "reward/accuracy": 0.5}', '{"step": 2, "reward/accuracy": "high"}'],
     "{p}:2: reward/accuracy holds 'high', not a number"),
    (['{"step": 1, "reward/accuracy": [0.5, 0.6]}'], "{p}:1: reward/accuracy holds [0.5, 0.6], not a number"),
    (['{"step": 1.5, "reward/accuracy": 0.5}'], "{p}:1: step holds 1.5, not a whole step number"),
    (['{"step": 1e20, "reward/accuracy": 0.5}'], "{p}:1: step holds 1e+20, outside 0..1000000000"),
    (['{"step": -1, "reward/accuracy": 0.5}'], "{p}:1: step holds -1, outside 0..1000000000"),
])
def test_imported_jsonl_that_is_not_numbers_is_refused_naming_file_line_key(tmp_path, capsys, rows, line):
    path = _jsonl(tmp_path / "log.jsonl", *rows)
    before = tree(tmp_path)
    assert refused(capsys, "compare", f"verl:{path}", "--out", tmp_path / "c.md") == line.format(p=path)
    assert tree(tmp_path) == before


def test_a_binary_file_is_refused_as_not_text(tmp_path, capsys):
    path = tmp_path / "log.jsonl"
    path.write_bytes(bytes(range(256)) * 4)
    assert refused(capsys, "compare", f"verl:{path}", "--out", tmp_path / "c.md") == (
        f"{path}: not text (byte 128 is not UTF-8); a metrics log is UTF-8 text")


def test_non_finite_values_are_left_out_of_means_and_named(tmp_path, capsys):
    path = _jsonl(tmp_path / "log.jsonl", '{"step": 1, "reward/accuracy": 0.4}', '{"step": 2, "reward/accuracy": NaN}',
                  '{"step": 3, "reward/accuracy": Infinity}', '{"step": 4, "reward/accuracy": 0.6}')
    out = ok(capsys, "compare", f"verl:{path}", "--out", tmp_path / "c.md")
    assert "step 2: reward/accuracy is NaN; left out" in out and "step 3: reward/accuracy is inf; left out" in out
    from repro.analysis import load_sources

    frames = load_sources(f"verl:{path}")[0]
    assert frames.train["reward/accuracy"].mean() == pytest.approx(0.5)  # (0.4 + 0.6) / 2
    text = (tmp_path / "c.md").read_text()
    assert "inf%" not in text and "inf pt" not in text and "nan%" not in text


def test_a_wandb_csv_with_infinity_or_a_fractional_step(tmp_path, capsys):
    good = tmp_path / "good.csv"
    good.write_text("_step,reward/accuracy\n1,0.4\n2,inf\n3,0.6\n")
    assert "step 2: reward/accuracy is inf; left out" in ok(capsys, "compare", f"wandb:{good}", "--out",
                                                             tmp_path / "c.md")
    bad = tmp_path / "bad.csv"
    bad.write_text("_step,reward/accuracy\n1,0.4\n2.5,0.5\n")
    assert refused(capsys, "compare", f"wandb:{bad}", "--out", tmp_path / "d.md") == (
        f"{bad}:3: step holds 2.5, not a whole step number")


def test_a_lumenrl_log_with_infinity_is_read_with_the_value_left_out(tmp_path, capsys):
    log = tmp_path / "train.log"
    head = "2026-08-17 09:00:10 [INFO] lumenrl.trainer.callbacks: "
    log.write_text("".join(f"{head}step={s} reward/accuracy={v}\n" for s, v in ((1, "0.4"), (2, "inf"), (3, "0.6"))))
    assert "step 2: reward/accuracy is inf; left out" in ok(capsys, "compare", f"lumenrl:{log}", "--out",
                                                             tmp_path / "c.md")


def test_a_runs_own_log_with_a_string_or_nan_is_named_or_left_out(space, capsys):
    run, _ = space
    rows = (run / "metrics.jsonl").read_text().splitlines()
    nan_row = json.loads(rows[1])
    assert nan_row["kind"] == "train"
    rows[1] = json.dumps({**nan_row, "reward/accuracy": float("nan")})  # json writes the NaN literal
    (run / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    assert f"step {nan_row['step']}: reward/accuracy is NaN; left out" in ok(capsys, "compare", run, "--out",
                                                                             run.parent / "c.md")
    rows[1] = json.dumps({**nan_row, "reward/accuracy": "0.5"})
    (run / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    assert refused(capsys, "compare", run, "--out", run.parent / "d.md") == (
        f"{run / 'metrics.jsonl'}:2: reward/accuracy holds '0.5', not a number")


# ------------------------------------------------------------------------------------------------ the rest
def test_minor_items_give_one_line(tmp_path, capsys):
    assert usage_error(capsys, "data", "--out", tmp_path / "d", "--digits", "0") == (
        "repro data: error: argument --digits: invalid choice: 0 (choose from 1, 2, 3)")
    assert not (tmp_path / "d").exists()
    assert refused(capsys, "rollouts", tmp_path / "missing", "--step", "1") == (
        f"{tmp_path / 'missing'}: no such folder (a repro run directory, e.g. runs/tiny-cpu)")
    said = refused(capsys, "recipe", "tiny-cpu", "--set", "algorithm.prompts_per_step=1", "--set",
                   "algorithm.responses_per_prompt=2", "--set", "algorithm.updates_per_step=5")
    assert said.splitlines()[1:] == ["  algorithm.updates_per_step: 5 updates cannot each take rows of a batch of 2 "
                                     "(algorithm.prompts_per_step x responses_per_prompt); at most 2"]
    for name in ("../../x", "/abs/x", ".."):
        said = refused(capsys, "recipe", "tiny-cpu", "--set", f"name={name}")
        assert said.splitlines()[1] == (f"  name: {name!r}: the run folder's default name (runs/<name>): must be a "
                                        "single folder name (no '/', '\\', '..' or '.')")
    ok(capsys, "recipe", "tiny-cpu", "--set", "algorithm.updates_per_step=2")  # the good case
