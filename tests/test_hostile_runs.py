"""Wrong and hostile input to a run folder (issue 39): a resume under another recipe, an edited or unreadable
recipe.yaml, links planted in the folder, checkpoints corrupted at the same size or sealed the old way, a log
that is not rows of numbers. Each case asserts the exit code, the one line, and that every byte the user owned is
unchanged (``tree`` of the folder and of the files outside it before and after); the good cases must stay good.

The run is real and made once: the tiny recipe, 2 steps, a checkpoint after each, in this process (in-process
groups, one torch thread); each test works on a copy. What is not covered here: the Ray path's restart (its advice
is the same ``resume_hint``, called here; tests/test_run_restarts.py runs Ray), and LumenRL's resume, which shares
repro.recipes.resume (tests/test_lumenrl_run.py).
"""

from __future__ import annotations

import os
import shutil

import pytest
from hostile_support import ok, refused, tree

from repro.engines import plan_run, run_recipe
from repro.owned import NotOurs, write_atomic
from repro.recipes import load_recipe
from repro.run.checkpoints import usable_checkpoint
from repro.run.metrics_log import MetricsLog
from repro.run.start import resume_hint

SETS = ["checkpoint.every_steps=1"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, one_thread):
    run = tmp_path_factory.mktemp("made") / "run"
    run_recipe(load_recipe("tiny-cpu", SETS, steps=2), run, in_process=True, say=lambda line: None)
    return run


@pytest.fixture
def run(finished, tmp_path):
    copy = tmp_path / "runs" / "run"
    shutil.copytree(finished, copy, symlinks=True)
    return copy


def resume(*more: str) -> list[str]:
    return ["run", "--in-process", "--quiet", "--resume", *more]


# ------------------------------------------------------------------------------------ a resume's recipe
def test_a_resume_that_changes_training_is_refused_listing_each_field(run, capsys):
    before = tree(run)
    said = refused(capsys, *resume("--run-dir", run, "--steps", "3", "--set", "optim.lr=0.01"))
    assert said == (f"--resume runs the recipe the run started with, as {run / 'recipe.yaml'} records it; these "
                    "fields differ and would change training: optim.lr: 5e-05 -> 0.01. Resume with the run's own "
                    f"recipe (repro run --resume --run-dir {run}, no --recipe), or start a new --run-dir")
    said = refused(capsys, *resume("--run-dir", run, "--recipe", "tiny-cpu-long"))
    assert "data.train.kind: 'tiny_math_train' -> 'tiny_math_long_train'" in said and "\n" not in said
    assert tree(run) == before  # run.lock included: refused before the lock is taken


def test_an_edited_recipe_yaml_is_refused_against_the_checkpoints_copy(run, capsys):
    recipe = run / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("lr: 5.0e-05", "lr: 0.01"))
    before = tree(run)
    said = refused(capsys, *resume("--run-dir", run, "--steps", "3"))
    assert said.startswith(f"--resume runs the recipe the run started with, as "
                           f"{run / 'checkpoints' / 'step_000002' / 'recipe.yaml'} records it; these fields differ "
                           "and would change training: optim.lr: 5e-05 -> 0.01.")
    assert said.endswith(f"{recipe} was changed since step 2 was trained with it: put those values back there, or "
                         "start a new --run-dir")
    assert tree(run) == before  # the user's edit is not overwritten either


def test_an_unreadable_recipe_yaml_is_refused_naming_file_and_line(run, capsys):
    recipe = run / "recipe.yaml"
    lines = recipe.read_text().splitlines()
    recipe.write_text("\n".join(lines[:3] + ["seed: [1, 2"] + lines[4:]) + "\n")
    before = tree(run)
    said = refused(capsys, *resume("--run-dir", run, "--steps", "3"))
    assert said.startswith(f"{recipe}:") and "not valid YAML" in said and "\n" not in said
    assert tree(run) == before
    recipe.write_text("\n".join(lines[:3] + ["seed: ten"] + lines[4:]) + "\n")
    before = tree(run)
    assert refused(capsys, *resume("--run-dir", run, "--steps", "3")) == (
        f"{recipe}:4: not a recipe this repro reads: seed: Input should be a valid integer (got str 'ten')")
    assert tree(run) == before


def test_a_plain_resume_of_a_finished_run_changes_nothing(run, capsys):
    before = tree(run)
    assert "the run is finished" in ok(capsys, *resume("--run-dir", run))  # the run's own recipe: no --recipe
    assert tree(run) == before  # recipe.yaml not rewritten


def test_a_resume_continues_on_the_bf16_gemm_path_the_run_took(run, capsys):
    """A run started with actor.bf16_gemm=auto took one path on this CPU; resumed where auto takes the other (forced
    here by the recipe field, as REPRO_BF16_GEMM would), its trainer refuses, naming the setting that continues it;
    following that advice passes the resume's recipe check (the field may change) and records the change."""
    import json

    saved = json.loads(
        (run / "checkpoints" / "step_000002" / "trainer" / "trainer_state.json").read_text())["bf16_gemm"]
    other = {"native": "fp32", "fp32": "native"}[saved]
    before = tree(run)
    said = refused(capsys, *resume("--run-dir", run, "--steps", "3", "--set", f"actor.bf16_gemm={other}"))
    assert f"computed its BF16 GEMMs on the '{saved}' path; this one would take '{other}'" in said
    assert said.endswith(f"Continue it as it started: set actor.bf16_gemm={saved} (or REPRO_BF16_GEMM={saved})")
    assert {k: v for k, v in tree(run).items() if "run.lock" not in k} == {
        k: v for k, v in before.items() if "run.lock" not in k}
    ok(capsys, *resume("--run-dir", run, "--steps", "3", "--set", f"actor.bf16_gemm={saved}"))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {"kind": "resume", "step": 2, "changed": {"actor.bf16_gemm": ["auto", saved], "steps": [2, 3]}} in rows
    assert [r["actor/bf16_gemm_fp32"] for r in rows if r["kind"] == "train"] == [float(saved == "fp32")] * 3


def test_a_run_name_is_one_folder_name(capsys):
    said = refused(capsys, "run", "--in-process", "--set", "name=../../outside")
    assert said.splitlines()[1].startswith("  name: '../../outside': the run folder's default name (runs/<name>)")


# --------------------------------------------------------------------------------------------- links
@pytest.mark.parametrize("name", ["run.lock", "metrics.jsonl.tmp", ".write-probe", "metrics.jsonl"])
def test_a_link_out_of_the_run_folder_is_refused_naming_it(run, tmp_path, capsys, name):
    outside = tmp_path / "outside.txt"
    outside.write_text("the user's file\n")
    (run / name).unlink(missing_ok=True)
    (run / name).symlink_to(outside)
    before, outside_before = tree(run), outside.read_bytes()
    said = refused(capsys, *resume("--run-dir", run, "--steps", "3"))
    assert said.startswith(f"{run / name}: a link out of the run folder (to {outside})")
    assert tree(run) == before and outside.read_bytes() == outside_before


def test_a_new_run_beside_a_planted_link_and_the_writers_themselves(tmp_path, capsys):
    outside = tmp_path / "outside.txt"
    outside.write_text("the user's file\n")
    new = tmp_path / "new"
    new.mkdir()
    (new / ".write-probe").symlink_to(outside)
    assert refused(capsys, "run", "--in-process", "--run-dir", new).startswith(f"{new / '.write-probe'}: a link out")
    log = tmp_path / "metrics.jsonl"
    log.symlink_to(outside)
    with pytest.raises(NotOurs, match=rf"{log}: a link \(to {outside}\)"):
        MetricsLog(log).append({"kind": "train", "step": 1})
    (tmp_path / "file.txt.tmp").symlink_to(outside)  # a temp name planted as a link: removed, never written through
    write_atomic(tmp_path / "file.txt", "ours\n")
    assert outside.read_text() == "the user's file\n" and (tmp_path / "file.txt").read_text() == "ours\n"


# ----------------------------------------------------------------------------------------- checkpoints
def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    stat = path.stat()
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the same size and time: only the content tells


def test_a_checkpoint_corrupt_at_the_same_size_is_skipped_and_the_one_before_used(run, tmp_path, capsys):
    bad = run / "checkpoints" / "step_000002" / "trainer" / "model.safetensors"
    _flip_a_byte(bad)
    why = "trainer/model.safetensors does not match its digest in COMPLETE (changed or corrupt since written)"
    recipe = load_recipe("tiny-cpu", SETS, steps=3)
    plan = plan_run(recipe, run, resume=True)
    assert plan.checkpoint.step == 1 and plan.describe().startswith(
        f"resuming from step 1 (checkpoint {run / 'checkpoints' / 'step_000001'}); not used: "
        f"{run / 'checkpoints' / 'step_000002'} ({why})")
    assert resume_hint(run).startswith(  # the Ray path's advice names a checkpoint that verifies
        f"the last good checkpoint is step 1 ({run / 'checkpoints' / 'step_000001'}): rerun with --resume")
    assert refused(capsys, "export", run, "--out", tmp_path / "e", "--step", "2") == (
        f"{run / 'checkpoints' / 'step_000002'} is not exported: {why}")
    said = ok(capsys, "export", run, "--out", tmp_path / "e")
    assert f"not exported: {run / 'checkpoints' / 'step_000002'} ({why})" in said
    assert f"{tmp_path / 'e'}: step 1, deepseek layout" in said
    # the good case: a resume that extends the run and allows a restart (fields a resume may change), from the
    # checkpoint before the corrupt one; the user's file beside the run is left alone
    (run / "my-notes.txt").write_text("kept\n")
    ok(capsys, *resume("--run-dir", run, "--steps", "3", "--max-restarts", "1"))
    assert usable_checkpoint(run / "checkpoints")[0].step == 3
    rows = MetricsLog(run / "metrics.jsonl").rows()
    assert {"kind": "resume", "step": 1, "changed": {"checkpoint.max_restarts": [0, 1], "steps": [2, 3]}} in rows
    assert [(r["kind"], r["step"]) for r in rows if r["kind"] == "train"] == [("train", 1), ("train", 2), ("train", 3)]
    assert "steps: 3\n" in (run / "recipe.yaml").read_text() and (run / "my-notes.txt").read_text() == "kept\n"


@pytest.mark.parametrize("marker, why", [
    ("2", "COMPLETE holds the step only (written before file digests): cannot be verified"),
    ('{"step": 2, "files": {"loop_state.json": 10}}', "COMPLETE lists sizes only (written before file digests): "
                                                     "cannot be verified"),
    ('{"step": 2, "files": ["loop_state.json"]}', "COMPLETE is malformed ('files' is not a mapping of file -> "
                                                  "size and digest)"),
    ('{"step": 2, "files": {"../../x": {"size": 1, "xxh3_128": "0"}}}',
     "COMPLETE is malformed at '../../x' (expected {size, xxh3_128} of a file inside)"),
    ("{not json", "COMPLETE is unreadable (not JSON)"),
])
def test_an_old_or_malformed_marker_is_never_trusted(run, tmp_path, capsys, marker, why):
    (run / "checkpoints" / "step_000002" / "COMPLETE").write_text(marker)
    before = tree(run)
    assert usable_checkpoint(run / "checkpoints") == (
        usable_checkpoint(run / "checkpoints")[0], [f"{run / 'checkpoints' / 'step_000002'} ({why})"])
    assert usable_checkpoint(run / "checkpoints")[0].step == 1
    assert refused(capsys, "export", run, "--out", tmp_path / "e", "--step", "2") == (
        f"{run / 'checkpoints' / 'step_000002'} is not exported: {why}")
    assert tree(run) == before


# ----------------------------------------------------------------------------------- the run's own log
@pytest.mark.parametrize("row, line", [
    ("42", ":{n}: expected a JSON object, got int 42"),
    ('{"kind": "train", "reward/accuracy": 0.5}', ":{n}: step: missing (every row names its step)"),
    ('{"kind": "train", "step": 2.5}', ":{n}: step holds 2.5, not a whole step number"),
    ('{"kind": "train", "step": 2, "reward/accuracy": "high"}', ":{n}: reward/accuracy holds 'high', not a number"),
])
def test_a_resume_refuses_a_log_row_that_is_not_numbers(run, capsys, row, line):
    log = run / "metrics.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:2] + [row] + lines[2:]) + "\n")
    before = tree(run)
    assert refused(capsys, *resume("--run-dir", run, "--steps", "3")) == f"{log}" + line.format(n=3)
    assert tree(run) == before
