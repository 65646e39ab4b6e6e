"""engine: lumenrl end to end through the one entry point (repro.engines), on a STAND-IN for LumenRL.

The program started here is tests/standins/lumenrl_trainer_main.py, not LumenRL (which needs AMD's images and GPUs):
it writes LumenRL's log lines and checkpoint folders at a set pace, crashes when told, and resumes from its
tracker. What is tested is our side: the config we write, the process group we start and stop, the log we stream,
the checkpoint we resume from.
"""

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import repro
from lumenrl_support import make_standin_checkout, sigint_ignored, standin_overrides
from repro.lumenrl import launch
from repro.errors import RecipeError, ReproError
from repro.lumenrl.launch import LumenRLError
from repro.recipes import load_recipe
from repro.run.metrics_log import MetricsLog
from repro.engines import plan_run, run_recipe

AMD = "amd-dsv4-flash-mi308x"


@pytest.fixture
def standin(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMENRL_STANDIN_STEP_S", "0.05")
    checkout = make_standin_checkout(tmp_path)
    return checkout, tmp_path


@pytest.fixture
def no_unpickling(monkeypatch):
    """LumenRL's checkpoint_N.pt is a torch pickle: nothing on our side may open one."""
    import torch

    def refuse(*args, **kwargs):
        raise AssertionError("a LumenRL checkpoint was unpickled")

    for module, name in ((torch, "load"), (pickle, "load"), (pickle, "loads")):
        monkeypatch.setattr(module, name, refuse)


@pytest.fixture(params=["inherited", "ignored"])
def parent_sigint(request):
    """This process's SIGINT as pytest found it, or ignored, as `make test &` and `nohup make test &` leave it:
    an ignored signal stays ignored in every child, so LumenRL would never see the SIGINT that stops it cleanly.
    Yields whether this process ignores SIGINT now (read back from /proc, so the "ignored" case cannot be vacuous)."""
    if request.param == "inherited":
        yield sigint_ignored(os.getpid())
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert sigint_ignored(os.getpid())
        yield True
    finally:
        signal.signal(signal.SIGINT, before)


def _recipe(checkout, tmp_path, *extra, steps=8):
    return load_recipe(AMD, standin_overrides(checkout, tmp_path / "inputs", steps, save_every=2, eval_every=4)
                       + list(extra))


def test_a_crashed_run_resumes_from_lumenrls_checkpoint_and_streams_every_step(standin, monkeypatch, no_unpickling):
    checkout, tmp_path = standin
    recipe, run_dir, said = _recipe(checkout, tmp_path), tmp_path / "run", []
    monkeypatch.setenv("LUMENRL_STANDIN_DIE_AFTER", "5")
    seen = []
    with pytest.raises(LumenRLError) as err:
        run_recipe(recipe, run_dir, progress=lambda step, row: seen.append(step), say=said.append)
    message = str(err.value)
    assert "LumenRL exited with status 1 after logging step 5" in message and "stand-in crash" in message
    assert f"the last LumenRL checkpoint is step 4 ({run_dir / 'checkpoints' / 'global_step_4'})" in message
    assert seen == [1, 2, 3, 4, 5]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("global_step_*")) == ["global_step_2",
                                                                                         "global_step_4"]
    written = yaml.safe_load((run_dir / "lumenrl" / "config.yaml").read_text())
    assert (written["num_training_steps"], written["checkpointing"]["save_steps"], written["val_steps"]) == (8, 2, 4)
    assert written["checkpointing"] == {"checkpoint_dir": str(run_dir / "checkpoints"), "save_steps": 2,
                                        "save_total_limit": 2, "resume": False}
    assert not (run_dir / "lumenrl" / "process.json").exists()

    monkeypatch.delenv("LUMENRL_STANDIN_DIE_AFTER")
    plan = plan_run(recipe, run_dir, resume="auto")
    assert (plan.checkpoint.step, [r["step"] for r in plan.kept_rows], plan.dropped_steps) == (4, [1, 2, 3, 4], [5])
    outcome = run_recipe(recipe, run_dir, resume="auto", progress=lambda step, row: seen.append(step),
                         say=said.append)
    assert (outcome.start_step, outcome.end_step) == (4, 8) and seen[5:] == [5, 6, 7, 8]
    assert yaml.safe_load((run_dir / "lumenrl" / "config.yaml").read_text())["checkpointing"]["resume"] is True
    rows = MetricsLog(run_dir / "metrics.jsonl").rows()
    train = {r["step"]: r for r in rows if r["kind"] == "train"}
    assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(1, 9))  # step 5 once: the recomputed one
    assert train[5]["reward/accuracy"] == pytest.approx(0.426) and train[4]["reward/accuracy"] == pytest.approx(0.42)
    assert train[8]["rollout_corr/kl"] == pytest.approx(0.0032) and train[8]["perf/rollout_tokens_per_s"] == 308
    # the EvalCallback's evaluation after step 1 (eval.at_start -> eval.enabled; logged before the crash, kept), then
    # the validations after every 4th update (val_steps); the resumed attempt starts past the EvalCallback's step
    assert [(r["step"], r["eval/avg@8"]) for r in rows if r["kind"] == "eval"] == [(1, pytest.approx(0.31)),
                                                                                  (4, pytest.approx(0.34)),
                                                                                  (8, pytest.approx(0.38))]
    assert (run_dir / "metrics.parquet").is_file()
    log = (run_dir / "logs" / "lumenrl.log").read_text()
    assert log.count("=== repro: starting LumenRL") == 2 and "=== exit=1 ===" in log and \
        log.endswith("=== exit=0 ===\n")
    assert any("resuming from step 4" in line for line in said)
    again = plan_run(recipe, run_dir, resume="auto")
    assert again.finished and "the run is finished" in again.describe()


def test_a_new_run_refuses_a_checkpoint_folder_another_run_filled(standin):
    checkout, tmp_path = standin
    shared = tmp_path / "shared-ckpt"
    (shared / "global_step_25" / "actor").mkdir(parents=True)
    recipe = _recipe(checkout, tmp_path, f"lumenrl.checkpoint_dir={shared}")
    with pytest.raises(LumenRLError, match=r"lumenrl.checkpoint_dir: .*shared-ckpt already holds global_step_25"):
        run_recipe(recipe, tmp_path / "run", say=lambda line: None)


def test_inputs_missing_on_the_head_and_a_run_in_the_way_are_named(standin):
    checkout, tmp_path = standin
    recipe = _recipe(checkout, tmp_path, "data.eval.path=/nowhere/aime.jsonl")
    with pytest.raises(RecipeError, match="data.eval.path: path does not exist: /nowhere/aime.jsonl"):
        run_recipe(recipe, tmp_path / "run", say=lambda line: None)
    recipe = _recipe(checkout, tmp_path, steps=2)  # AMD's 284B parameters: no checkpoint-size check in the run dir
    run_recipe(recipe, tmp_path / "run", say=lambda line: None)
    with pytest.raises(ReproError, match="already holds a run .metrics.jsonl.; pass --resume"):
        run_recipe(recipe, tmp_path / "run", say=lambda line: None)
    assert run_recipe(recipe, tmp_path / "run", resume=True, say=lambda line: None).already_finished


def test_a_missing_checkout_is_named_before_anything_starts(tmp_path):
    recipe = load_recipe(AMD, ["engine=lumenrl", f"lumenrl.path={tmp_path / 'nowhere'}"])
    with pytest.raises(LumenRLError, match=r"lumenrl.path: .*nowhere is not a folder"):
        run_recipe(recipe, tmp_path / "run", say=lambda line: None)
    assert not (tmp_path / "run").exists()


def _start(checkout, tmp_path, name, **env):
    """The stand-in, running: returned once it logged its first step (so its signal handlers are in place)."""
    command = [sys.executable, "-u", "-m", launch.ENTRY_MODULE, "--config", str(tmp_path / "c.yaml")]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({
        "num_training_steps": 1000, "algorithm": {"name": "grpo"}, "policy": {"model_name": "m"},
        "checkpointing": {"checkpoint_dir": str(tmp_path / "ck"), "save_steps": 1000, "save_total_limit": 1}}))
    log = tmp_path / f"{name}.log"
    process = launch.start_lumenrl(command, {"PYTHONPATH": str(checkout), **env}, checkout, log)
    deadline = time.monotonic() + 60
    while "step=1 " not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "step=1 " in log.read_text()
    return process


def test_stop_interrupts_lumenrls_group_only_and_escalates_when_ignored(standin, parent_sigint):
    checkout, tmp_path = standin
    process = _start(checkout, tmp_path, "polite")
    assert os.getpgid(process.pid) == process.pid != os.getpgid(0)  # its own group: our signals never reach us
    assert not sigint_ignored(process.pid)  # whatever we inherited (the launcher exec'd LumenRL in place)
    assert process.stop(grace_s=20) == ["SIGINT"]
    assert process.poll() == 0 and "Training interrupted by user." in (tmp_path / "polite.log").read_text()
    stubborn = _start(checkout, tmp_path, "stubborn", LUMENRL_STANDIN_IGNORE_SIGNALS="1")
    assert stubborn.stop(grace_s=0.5) == ["SIGINT", "SIGTERM", "SIGKILL"]
    assert stubborn.poll() == -signal.SIGKILL and not stubborn.group_alive()


def test_a_group_an_earlier_launch_left_is_ended_by_pid_and_start_time_only(standin, parent_sigint):
    checkout, tmp_path = standin
    process = _start(checkout, tmp_path, "left")
    record = tmp_path / "process.json"
    launch.record_process(record, process)
    # LumenRL's, not the launcher's
    assert json.loads(record.read_text())["command"][:3] == [sys.executable, "-u", "-m"]
    ended = launch.end_recorded_process(record, grace_s=20)
    assert ended.startswith(f"{process.pid} (") and process.popen.wait(timeout=20) == 0 and not record.exists()
    # a record whose start time does not match (a recycled pid: here, this very test process) touches nothing
    record.write_text(f'{{"pid": {os.getpid()}, "create_time": 1.0, "command": ["x"]}}')
    assert launch.end_recorded_process(record) is None and not record.exists()


def test_our_failure_mid_run_stops_lumenrl(standin, parent_sigint):
    checkout, tmp_path = standin
    recipe = _recipe(checkout, tmp_path, steps=200)

    def broken(step, row):
        if step == 2:
            raise RuntimeError("the live plot broke")

    said = []
    with pytest.raises(RuntimeError, match="the live plot broke"):
        run_recipe(recipe, tmp_path / "run", progress=broken, say=said.append)
    log = (tmp_path / "run" / "logs" / "lumenrl.log").read_text()
    assert "Training interrupted by user." in log  # stopped with SIGINT: LumenRL's own clean-up ran
    pid = int(next(line for line in said if line.startswith("LumenRL started (pid ")).split()[3].rstrip(","))
    assert f"stopped LumenRL (pid {pid}) with SIGINT" in said and launch.live_members(pid) == []
    assert not (tmp_path / "run" / "lumenrl" / "process.json").exists()


@pytest.mark.slow
def test_repro_launch_runs_lumenrl_and_its_dry_run_shows_the_config(standin):
    checkout, tmp_path = standin
    sets = [a for o in standin_overrides(checkout, tmp_path / "inputs", 4, 2, 2) if not o.startswith("steps=")
            for a in ("--set", o)]
    env = {**os.environ, "PYTHONPATH": str(repro.REPO_DIR)}
    base = [sys.executable, "-m", "repro", "launch", "--recipe", AMD, "--steps", "4", "--run-dir",
            str(tmp_path / "run"), "--quiet", *sets]
    dry = subprocess.run(base + ["--dry-run"], capture_output=True, text=True, env=env, timeout=120)
    assert dry.returncode == 0, dry.stderr
    lines = {line.split()[0]: line for line in dry.stdout.splitlines() if line.strip()}
    # the AMD recipe writes the file's 0.92 (what ran); the run's length is the recipe's, not the file's 200
    assert lines["policy.generation.vllm_cfg.gpu_memory_utilization"].split()[1:] == ["0.92", "0.92"]
    assert lines["num_training_steps"].split()[1:] == ["4", "200", "<-", "differs"]
    assert lines["policy.learning_rate"].split()[1:] == ["1e-06", "1e-06"]
    assert not (tmp_path / "run").exists()  # a dry run writes nothing
    done = subprocess.run(base, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = MetricsLog(tmp_path / "run" / "metrics.jsonl").rows()
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2, 3, 4]
