"""Faults a run meets that are the driver's own (in-process groups; worker deaths on Ray are in
test_run_restarts.py): a full disk while a metrics line and while a checkpoint is written, the driver killed while a
checkpoint is written, two runs started on one run directory. For each: what the user is told names the step and
the file; no incomplete checkpoint is taken for complete; no row is lost, torn or repeated; --resume ends with the
uninterrupted run's numbers.

A full disk is made with RLIMIT_FSIZE (a write past the limit fails with EFBIG, as a full disk fails with
ENOSPC: the same partial write, then an OSError), which any user may set; where the test may mount one (root), a
real full tmpfs (ENOSPC) runs the same checks on the log and on a checkpoint write.
"""

import os
import resource
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from run_faults_support import CLI_ENV, FAULT_RUN, log_rows, numbers

from repro.errors import CheckpointError, ReproError, WorkerError
from repro.recipes import load_recipe
from repro.run.checkpoints import incomplete_checkpoints, latest_checkpoint, save_checkpoint
from repro.run.metrics_log import MetricsLog
from repro.run.restarts import Restarts, RunStopped, StepFailed
from repro.engines import plan_run, run_recipe

STEPS = 4


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    """One torch thread, as the baseline's (tests/conftest.py fault_baseline)."""


def recipe(*extra: str):
    return load_recipe("tiny-cpu", [*FAULT_RUN, *extra], steps=STEPS)


@contextmanager
def file_size_limit(nbytes: int):
    """Writes by this process past ``nbytes`` in any file fail (EFBIG), until the block ends."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@contextmanager
def full_tmpfs(where: Path):
    """A 1 MiB tmpfs mounted at ``where`` (needs root), yielding a function that fills what is left of it."""
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root); the RLIMIT_FSIZE variant ran")

    def fill():
        with open(where / "filler", "ab", buffering=0) as handle:
            try:
                while True:
                    handle.write(b"\0" * 4096)
            except OSError:  # ENOSPC: nothing is left
                pass

    try:
        yield fill
    finally:
        subprocess.run(["umount", str(where)], check=True)


# -- the log and a checkpoint on a full disk, each alone ---------------------------------------------------
@pytest.mark.parametrize("disk", ["fsize", "tmpfs"])
def test_a_metrics_line_that_does_not_fit_leaves_the_log_byte_for_byte_as_it_was(tmp_path, disk):
    folder = tmp_path / "fs"
    with (full_tmpfs(folder) if disk == "tmpfs" else _made(folder)) as fill:
        log = MetricsLog(folder / "metrics.jsonl")
        log.append({"kind": "train", "step": 1, "reward/accuracy": 0.5})
        before = log.path.read_bytes()
        row = {"kind": "train", "step": 2, "x" * 6000: 1.0}  # longer than the space left: written in part
        with (file_size_limit(len(before) + 100) if disk == "fsize" else _filled(fill)):
            with pytest.raises(ReproError) as failed:
                log.append(row)
        assert log.path.read_bytes() == before
        assert str(failed.value).startswith(f"{log.path}: could not append the train row of step 2 (")
        assert ("File too large" if disk == "fsize" else "No space left on device") in str(failed.value)
        if disk == "tmpfs":
            (folder / "filler").unlink()
        log.append(row)  # space again: the row goes in whole
        assert log.rows()[-1] == row and log.path.read_bytes().startswith(before)


class StandInTrainer:
    """Writes a trainer state of ``nbytes`` (a stand-in for the trainer's save: only the checkpoint's side is
    under test here)."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes

    def save(self, directory: Path) -> Path:
        Path(directory).mkdir()
        (Path(directory) / "model.safetensors").write_bytes(b"\1" * self.nbytes)
        return directory


@pytest.mark.parametrize("disk", ["fsize", "tmpfs"])
def test_a_checkpoint_that_does_not_fit_is_removed_and_the_previous_one_stands(tmp_path, disk):
    folder = tmp_path / "fs"
    with (full_tmpfs(folder) if disk == "tmpfs" else _made(folder)) as fill:
        log = folder / "metrics.jsonl"
        log.write_text('{"kind": "train", "step": 2}\n')
        first = save_checkpoint(folder / "checkpoints", 2, StandInTrainer(1000), {"weight_version": 2}, log, 2)
        with (file_size_limit(200_000) if disk == "fsize" else _filled(fill)):
            with pytest.raises(CheckpointError) as failed:
                save_checkpoint(folder / "checkpoints", 4, StandInTrainer(300_000), {"weight_version": 4}, log, 2)
        message = str(failed.value)
        assert message.startswith("checkpoint step_000004 not written: ")
        assert f"its temp folder {folder / 'checkpoints' / '.tmp-step_000004'} is removed" in message
        assert message.endswith(f"the newest complete checkpoint is {first.path}")
        assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["step_000002"]
        assert latest_checkpoint(folder / "checkpoints") == first
        assert incomplete_checkpoints(folder / "checkpoints") == []


@contextmanager
def _made(folder: Path):
    folder.mkdir()
    yield None


@contextmanager
def _filled(fill):
    fill()
    yield


def test_a_checkpoint_whose_files_do_not_match_its_marker_is_not_taken_for_complete(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text("")
    two = save_checkpoint(tmp_path / "ck", 2, StandInTrainer(1000), {}, log, 3)
    four = save_checkpoint(tmp_path / "ck", 4, StandInTrainer(1000), {}, log, 3)
    (four.trainer_dir / "model.safetensors").write_bytes(b"\1" * 999)  # cut short after the marker was written
    assert latest_checkpoint(tmp_path / "ck") == two
    assert incomplete_checkpoints(tmp_path / "ck") == [
        f"{four.path} (trainer/model.safetensors is 999 bytes, COMPLETE lists 1000)"]


# -- whole runs ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_full_disk_while_appending_a_row_then_while_writing_a_checkpoint_and_resume_loses_nothing(
        tmp_path, fault_baseline):
    """RLIMIT_FSIZE set from the progress callback: after step 3's row, the next line (step 4's) does not fit;
    on the resume, after step 4's row, checkpoint 4's trainer state does not fit."""
    saved, before = resource.getrlimit(resource.RLIMIT_FSIZE), {}

    def fill_after(step_to_fill: int, nbytes):
        def progress(step, row):
            if step == step_to_fill:
                before["log"] = (tmp_path / "metrics.jsonl").read_bytes()
                resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes(), saved[1]))
        return progress

    try:
        with pytest.raises(RunStopped) as stopped:
            run_recipe(recipe(), tmp_path, in_process=True,
                       progress=fill_after(3, lambda: (tmp_path / "metrics.jsonl").stat().st_size + 100))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, saved)
    message = str(stopped.value)
    assert message.startswith(f"step 4: {tmp_path / 'metrics.jsonl'}: could not append the train row of step 4 "
                              "(File too large); the log is left as it was")
    assert message.endswith(f"the last good checkpoint is step 2 ({tmp_path / 'checkpoints' / 'step_000002'}): "
                            "rerun with --resume")
    assert (tmp_path / "metrics.jsonl").read_bytes() == before["log"]  # nothing torn, nothing half-written

    try:
        with pytest.raises(RunStopped) as stopped:
            run_recipe(recipe(), tmp_path, in_process=True, resume=True, progress=fill_after(4, lambda: 1 << 20))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, saved)
    message = str(stopped.value)
    assert message.startswith("step 4: checkpoint step_000004 not written: ") and "File too large" in message
    assert f"{tmp_path / 'checkpoints' / '.tmp-step_000004'} is removed" in message
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000002"]
    assert [(r["kind"], r["step"]) for r in log_rows(tmp_path)][-2:] == [("train", 4), ("eval", 4)]

    run_recipe(recipe(), tmp_path, in_process=True, resume=True)
    rows = log_rows(tmp_path)
    assert [(r["kind"], r["step"]) for r in rows] == [(r["kind"], r["step"]) for r in numbers(fault_baseline, STEPS)]
    assert numbers(rows) == numbers(fault_baseline, STEPS)


KILL_IN_CHECKPOINT = """
import os, signal, sys
from repro.groups import workers
real_save = workers.TrainerWorker.save

def save_then_die(self, directory):  # the driver killed (SIGKILL) once checkpoint 4's trainer state is on disk
    out = real_save(self, directory)
    if ".tmp-step_000004" in str(directory):
        os.kill(os.getpid(), signal.SIGKILL)
    return out

workers.TrainerWorker.save = save_then_die
from repro.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_driver_killed_while_writing_a_checkpoint_then_resume_uses_the_one_before(tmp_path, fault_baseline):
    script = tmp_path / "kill_in_checkpoint.py"
    script.write_text(KILL_IN_CHECKPOINT)
    run_dir = tmp_path / "run"
    args = [sys.executable, str(script), "run", "--in-process", "--quiet", "--run-dir", str(run_dir),
            "--steps", str(STEPS)] + [a for o in FAULT_RUN for a in ("--set", o)]
    killed = subprocess.run(args, env=CLI_ENV, capture_output=True, text=True,
                            timeout=600)
    assert killed.returncode == -9, killed.stderr[-2000:]
    checkpoints = run_dir / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == [".tmp-step_000004", "step_000002"]
    assert latest_checkpoint(checkpoints).step == 2
    plan = plan_run(recipe(), run_dir, resume=True)
    assert plan.describe() == (
        f"resuming from step 2 (checkpoint {checkpoints / 'step_000002'}); not used: "
        f"{checkpoints / '.tmp-step_000004'} (a write that did not finish: removed at the next checkpoint); "
        "steps 3-4 logged after it are dropped and recomputed")
    run_recipe(recipe(), run_dir, in_process=True, resume=True)  # the killed driver's lock went with it
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_000002", "step_000004"]
    rows = log_rows(run_dir)
    assert [(r["kind"], r["step"]) for r in rows] == [(r["kind"], r["step"]) for r in numbers(fault_baseline, STEPS)]
    assert numbers(rows) == numbers(fault_baseline, STEPS)


@pytest.mark.slow
def test_a_second_run_on_a_run_directory_in_use_fails_at_once_naming_the_first(tmp_path, fault_baseline):
    args = [sys.executable, "-m", "repro", "run", "--in-process", "--quiet", "--run-dir", str(tmp_path),
            "--steps", str(STEPS)] + [a for o in FAULT_RUN for a in ("--set", o)]
    first = subprocess.Popen(args, env=CLI_ENV, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    lock = tmp_path / "run.lock"
    deadline = time.time() + 300
    while not (lock.exists() and lock.read_text().startswith(f"pid {first.pid} ")):
        assert first.poll() is None and time.time() < deadline, first.stderr.read()[-2000:]
        time.sleep(0.1)
    for resume in (False, True):
        started = time.monotonic()
        with pytest.raises(ReproError) as refused:
            run_recipe(recipe(), tmp_path, in_process=True, resume=resume)
        assert time.monotonic() - started < 5
        assert str(refused.value).startswith(f"run dir {tmp_path} is in use by another run (pid {first.pid} on ")
        assert str(refused.value).endswith(f"lock {lock}): wait for it to end or stop it, or choose another --run-dir")
    assert first.wait(timeout=600) == 0, first.stderr.read()[-2000:]
    rows = log_rows(tmp_path)
    assert [(r["kind"], r["step"]) for r in rows] == [(r["kind"], r["step"]) for r in numbers(fault_baseline, STEPS)]
    assert numbers(rows) == numbers(fault_baseline, STEPS)


# -- when a run restarts itself ----------------------------------------------------------------------------
def _died(step: int, worker: str = "rollout worker 0", call: str = "generate", died: bool = True) -> StepFailed:
    line = "The actor died unexpectedly before finishing this task."
    return StepFailed(step, WorkerError(f"{worker} {'died' if died else 'failed'} during {call}: {line}",
                                        worker=worker, call=call, cause=line, died=died))


def test_restarts_are_granted_only_for_a_death_within_the_limit_and_never_for_the_same_fault_twice():
    hint = "the last good checkpoint is step 2 (x): rerun with --resume"
    workers = {"rollout worker 0": {"pid": 41, "host": "h", "log": "/tmp/ray/worker-41.err"}}
    with pytest.raises(RunStopped, match=r"^step 3: rollout worker 0 died during generate: The actor died "
                       r"unexpectedly before finishing this task\. \[rollout worker 0: pid 41 on h, its output: "
                       r"/tmp/ray/worker-41\.err\]; the run does not restart itself \(checkpoint\.max_restarts 0; "
                       r"--max-restarts N lets it\); the last good"):
        Restarts(0).allow(_died(3), workers, hint)
    with pytest.raises(RunStopped, match=r"^step 3: rollout worker 0 failed during generate: .*; the last good"):
        Restarts(2).allow(_died(3, died=False), workers, hint)  # it raised: new workers would raise again
    restarts = Restarts(2)
    assert restarts.allow(_died(3), workers, hint).startswith("restart 1 of 2: step 3: rollout worker 0 died")
    assert restarts.pending == {"kind": "restart", "step": 3, "attempt": 1, "max_restarts": 2,
                                "worker": "rollout worker 0", "call": "generate", "cause": str(_died(3)) +
                                " [rollout worker 0: pid 41 on h, its output: /tmp/ray/worker-41.err]"}
    with pytest.raises(RunStopped, match=r"the same fault stopped the run at step 3 before restart 1"):
        restarts.allow(_died(3), workers, hint)
    assert restarts.allow(_died(3, "trainer worker 0", "scored_train_step"), workers, hint).startswith("restart 2")
    with pytest.raises(RunStopped, match=r"all 2 restarts \(checkpoint\.max_restarts\) are used"):
        restarts.allow(_died(5), workers, hint)


@pytest.mark.slow
def test_a_death_that_repeats_at_the_same_step_stops_after_one_restart_and_resume_loses_nothing(
        tmp_path, fault_baseline, monkeypatch):
    """A stand-in death (the loop's rollout call raises a dead worker's error at step 3, every time): what Ray
    reports when the rollout's process is killed (test_run_restarts.py kills real ones). The restart is real:
    new groups, the resume from checkpoint 2, the restart row."""
    import repro.run.loop as loop

    real = loop.generate_rollouts

    def dies_at_step_3(run, problems, step):
        if step == 3:
            raise _died(3).cause
        return real(run, problems, step)

    monkeypatch.setattr(loop, "generate_rollouts", dies_at_step_3)
    said = []
    with pytest.raises(RunStopped) as stopped:
        run_recipe(recipe("checkpoint.max_restarts=3"), tmp_path, in_process=True, say=said.append)
    assert str(stopped.value).startswith("step 3: rollout worker 0 died during generate: The actor died")
    assert ("the same fault stopped the run at step 3 before restart 1, so another restart would only repeat it: "
            f"not restarting again; the last good checkpoint is step 2 ({tmp_path / 'checkpoints' / 'step_000002'})"
            ) in str(stopped.value)
    assert sum(line.startswith("restart 1 of 3: step 3: rollout worker 0 died") for line in said) == 1
    restarts = [r for r in log_rows(tmp_path) if r["kind"] == "restart"]
    assert [(r["step"], r["attempt"], r["resumed_from"], r["worker"], r["call"]) for r in restarts] == [
        (3, 1, 2, "rollout worker 0", "generate")]

    monkeypatch.setattr(loop, "generate_rollouts", real)
    run_recipe(recipe(), tmp_path, in_process=True, resume=True)
    rows = log_rows(tmp_path)
    assert [r for r in rows if r["kind"] == "restart"] == restarts  # the run's history survives the resume
    assert numbers(rows) == numbers(fault_baseline, STEPS)

    from repro.analysis.caveats import restart_notes
    from repro.analysis.frame import load_run

    frames = load_run(tmp_path)
    assert list(frames.train.index) == [1, 2, 3, 4] and frames.restarts == restarts
    assert restart_notes(frames) == [
        "The run restarted itself 1 time after a worker died (at step 3 rollout worker 0 died during generate, "
        "resumed from step 2); the steps after each checkpoint it resumed from were recomputed, and step times "
        "are the recomputed steps' (the time lost to the restarts is in none of them)."]


def test_max_restarts_flag_sets_the_recipe_field(tmp_path, monkeypatch):
    from repro import cli

    seen = []

    def run_recipe_stand_in(recipe, run_dir, **kwargs):  # records the recipe the command built, runs nothing
        seen.append(recipe)
        raise ReproError("not run")

    monkeypatch.setattr("repro.engines.run_recipe", run_recipe_stand_in)
    assert cli.main(["run", "--max-restarts", "3", "--run-dir", str(tmp_path), "--quiet"]) == 1
    assert cli.main(["run", "--run-dir", str(tmp_path), "--quiet"]) == 1
    assert [r.checkpoint.max_restarts for r in seen] == [3, 0]  # the default: stop at a death, as LumenRL does
