"""The rough edges a new user met on the walkthrough (issue 12), each with the message or behaviour it has now."""

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro.notebooks import NotebookError, execute_notebook
from repro.recipes import load_recipe
from repro.run.checkpoints import save_checkpoint
from repro.engines import plan_run

TINY = load_recipe("tiny-cpu", ["steps=4"])


class _StubTrainer:
    def save(self, directory):
        Path(directory).mkdir(parents=True)
        return Path(directory)


def _run_dir_with_checkpoint(tmp_path: Path, step: int, logged_train_steps: list[int]) -> Path:
    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(json.dumps({"kind": "train", "step": s}) + "\n" for s in logged_train_steps))
    save_checkpoint(tmp_path / "checkpoints", step, _StubTrainer(), {"sampler": {}, "weight_version": step}, log, 2)
    return tmp_path


def test_resuming_a_finished_run_says_so_at_once(tmp_path):
    plan = plan_run(TINY, _run_dir_with_checkpoint(tmp_path, 4, [1, 2, 3, 4]), resume=True)
    assert plan.finished
    assert plan.describe() == f"{tmp_path}: the run is finished (checkpoint step 4); nothing to do"


def test_resume_names_its_checkpoint_and_the_steps_it_drops(tmp_path):
    run_dir = _run_dir_with_checkpoint(tmp_path, 2, [1, 2])
    with open(run_dir / "metrics.jsonl", "a") as log:  # logged after the checkpoint, before the kill
        log.write(json.dumps({"kind": "train", "step": 3}) + "\n" + json.dumps({"kind": "eval", "step": 3}) + "\n")
    plan = plan_run(TINY, run_dir, resume="auto")
    assert (plan.resume, plan.finished, plan.dropped_steps, [r["step"] for r in plan.kept_rows]) == \
        (True, False, [3], [1, 2])
    assert plan.describe() == (f"resuming from step 2 (checkpoint {run_dir / 'checkpoints' / 'step_000002'}); "
                               "step 3 logged after it is dropped and recomputed")


def test_an_unknown_notebook_parameter_is_refused_before_the_kernel_starts(tmp_path):
    with pytest.raises(NotebookError, match=r"02_smoke_run: unknown parameter\(s\) stpes \(did you mean steps\?\)"):
        execute_notebook("02_smoke_run", tmp_path, {"stpes": 1})


def test_a_closed_pipe_ends_the_command_quietly(monkeypatch):
    """`repro recipe tiny-cpu | head`: the reader goes away mid-output; no BrokenPipeError traceback, exit 0."""
    from repro import cli

    read_end, write_end = os.pipe()
    os.close(read_end)

    class ClosedPipe(io.TextIOWrapper):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    saved = os.dup(1)
    try:
        monkeypatch.setattr(sys, "stdout", ClosedPipe(io.BufferedWriter(io.FileIO(write_end, "w"))))
        assert cli.main(["recipe", "tiny-cpu"]) == 0
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def test_check_table_says_each_thing_once_and_has_a_fix_or_a_dash():
    from repro.readiness.facts import gather_facts
    from repro.readiness.checks import run_checks
    from repro.readiness.report import NOTHING_TO_DO, results_as_dicts

    rows = results_as_dicts(run_checks(TINY, gather_facts(TINY)))
    assert not any(r["detail"].startswith("SKIP") for r in rows)
    assert all(r["fix"] for r in rows) and \
        {r["fix"] for r in rows if r["status"] in ("PASS", "SKIP")} == {NOTHING_TO_DO}
    ram = next(r for r in rows if r["check"] == "host_ram")["detail"]
    # tiny-cpu's actor is bf16 (AMD's): 2 B weights + 4 B fp32 masters + 8 B moments = 14 B per parameter
    assert "need ~30.9 MB for the trainer's weights and optimizer state (CPU mode: they live in host RAM)" in ram


def test_recorded_processes_are_ended_only_when_pid_and_start_time_both_match(tmp_path):
    import psutil

    from repro.cluster.runtime import end_recorded_processes

    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        born = psutil.Process(sleeper.pid).create_time()
        record = tmp_path / "ray_processes.json"
        record.write_text(json.dumps({"processes": [{"pid": sleeper.pid, "create_time": born - 5, "name": "sleep"}]}))
        assert end_recorded_processes(record) == [] and sleeper.poll() is None  # a recycled pid: left alone
        record.write_text(json.dumps({"processes": [{"pid": sleeper.pid, "create_time": born, "name": "sleep"}]}))
        assert end_recorded_processes(record) == [f"{sleeper.pid} (sleep)"] and not record.exists()
        sleeper.wait(timeout=10)  # ended (psutil reaped it, so its status reads 0 here)
    finally:
        sleeper.kill()


def _start_ray_run(run_dir: Path) -> tuple[subprocess.Popen, Path]:
    args = [sys.executable, "-m", "repro", "run", "--quiet", "--run-dir", str(run_dir), "--set", "steps=50",
            "--set", "algorithm.prompts_per_step=4"]
    proc = subprocess.Popen(args, env=dict(os.environ, RAY_AUTH_MODE="disabled"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    record = run_dir / "logs" / "ray_processes.json"
    deadline = time.time() + 240
    while not (run_dir / "metrics.jsonl").exists():  # the groups are up and the run has logged
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        assert time.time() < deadline, "the run did not start within 240 s"
        time.sleep(0.5)
    return proc, record


def _alive(processes: list[dict]) -> list[int]:
    import psutil

    alive = []
    for p in processes:
        try:
            if abs(psutil.Process(p["pid"]).create_time() - p["create_time"]) < 1e-3:
                alive.append(p["pid"])
        except psutil.NoSuchProcess:
            pass
    return alive


def _wait_gone(processes: list[dict], timeout_s: float = 30.0) -> list[int]:
    deadline = time.time() + timeout_s
    while _alive(processes) and time.time() < deadline:
        time.sleep(0.5)
    return _alive(processes)


@pytest.mark.long
def test_sigterm_tears_down_the_local_ray_instance_the_run_started(tmp_path):
    proc, record = _start_ray_run(tmp_path)
    processes = json.loads(record.read_text())["processes"]
    assert processes and _alive(processes)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM, proc.stderr.read()[-3000:]
    assert _wait_gone(processes) == [] and not record.exists()


@pytest.mark.long
def test_a_run_after_a_sigkill_ends_what_the_killed_run_left_and_nothing_else(tmp_path):
    from repro.cluster.runtime import end_recorded_processes

    proc, record = _start_ray_run(tmp_path)
    processes = json.loads(record.read_text())["processes"]
    proc.kill()
    proc.wait(timeout=30)
    time.sleep(2)
    left = _alive(processes)
    print(f"\nafter SIGKILL, {len(left)} of {len(processes)} recorded Ray processes still run: {left}")
    assert end_recorded_processes(record) or not left  # what the next run does first (repro.run.start.ray_groups)
    assert _wait_gone(processes) == [] and not record.exists()


def test_convert_names_a_missing_input_as_missing_and_a_file_as_not_a_folder(tmp_path, capsys):
    from repro import cli

    assert cli.main(["convert", "--input", str(tmp_path / "no-such-dir"), "--output", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.strip() == f"repro convert: error: {tmp_path / 'no-such-dir'}: does not exist"
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert cli.main(["convert", "--input", str(tmp_path / "model.safetensors"), "--list"]) == 1
    assert "not a checkpoint folder (a file; give the folder that holds config.json)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
