"""A run that restarts itself on Ray (``checkpoint.max_restarts``): real worker processes killed with SIGKILL from
this test, by the process id the run recorded in logs/workers.json, while Ray shows them inside the call:

- step 3: the rollout actor mid-generation;
- step 5: the trainer actor mid-update;
- step 7: the trainer (the weight sync's sender) mid-send, while the rollout receives;
- step 9: the rollout actor mid-generation again.

The 10-step run restarts four times (each a restart row naming the step, the worker, its pid and log file, and the
checkpoint resumed from) and ends with the uninterrupted run's numbers; every worker process of every attempt is
gone afterwards. The run's driver is this process (one torch thread, as the baseline's), on a Ray instance the
test starts (as a notebook's would be).
"""

import os
import signal
import threading
import time

# Before Ray is imported anywhere: no token file in ~/.ray, no usage report.
os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

import pytest  # noqa: E402
from run_faults_support import BASELINE_STEPS, FAULT_RUN, log_rows, numbers, wait_gone  # noqa: E402

from repro.recipes import load_recipe  # noqa: E402
from repro.engines import run_recipe  # noqa: E402

ROLLOUT, TRAINER = "rollout worker 0", "trainer worker 0"
# step -> (worker killed, its Ray process title while in the call, the call the run then names)
KILLS = {
    3: (ROLLOUT, "ray::RolloutWorker.generate", "generate"),
    5: (TRAINER, "ray::TrainerWorker.scored_train_step", "scored_train_step"),
    7: (TRAINER, "ray::TrainerWorker.broadcast_weights", "weight sync"),
    9: (ROLLOUT, "ray::RolloutWorker.generate", "generate"),
}


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(address="local", num_cpus=2, num_gpus=0, object_store_memory=512 * 1024**2, include_dashboard=False,
             log_to_driver=False, namespace="repro")
    try:
        yield
    finally:
        ray.shutdown()


def current_workers(run_dir):
    import json

    return json.loads((run_dir / "logs" / "workers.json").read_text())["attempts"][-1]


class Killer:
    """SIGKILL one worker once Ray's title for its process shows it inside ``title`` (and, for the sync's sender,
    the rollout inside receive_weights as well: the stream is open on both sides); polls every millisecond from a
    thread of this process. Which bucket the sender had reached cannot be chosen from outside; a sender that stops
    between two buckets is tests/test_sync.py's dead-sender test."""

    def __init__(self, run_dir, worker: str, title: str):
        import psutil

        workers = {w["name"]: w for w in current_workers(run_dir)}
        self.process = psutil.Process(workers[worker]["pid"])
        self.peer = psutil.Process(workers[ROLLOUT]["pid"]) if title.endswith("broadcast_weights") else None
        self.title, self.seen, self.done = title, None, threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self):
        while not self.done.is_set():
            try:
                title = self.process.cmdline()[0]
                peer = self.peer.cmdline()[0] if self.peer is not None else "ray::RolloutWorker.receive_weights"
            except Exception:  # noqa: BLE001 -- the process went away some other way: nothing to kill
                return
            if title == self.title and peer == "ray::RolloutWorker.receive_weights":
                self.seen = title
                self.process.send_signal(signal.SIGKILL)
                return
            time.sleep(0.001)

    def stop(self):
        self.done.set()
        self.thread.join(10)


@pytest.mark.long
def test_a_run_that_loses_its_rollout_twice_and_its_trainer_twice_restarts_and_ends_as_the_uninterrupted_run(
        tmp_path, fault_baseline, local_ray, monkeypatch, one_thread):
    import repro.run.loop as loop

    pending, killers, at = dict(KILLS), [], {}
    real_generate, real_update, real_sync = loop.generate_rollouts, loop.update_policy, loop.sync_weights

    def killing(phase_title_ends, real, step_of):
        def call(*args):
            step = step_of(args)
            kill = pending.get(step)
            killer = None
            if kill is not None and kill[1].endswith(phase_title_ends):
                del pending[step]
                killer = Killer(tmp_path, kill[0], kill[1])
                killers.append((step, killer))
            try:
                return real(*args)
            finally:
                if killer is not None:
                    killer.stop()
        return call

    def generate(run, problems, step):
        at["step"] = step
        return real_generate(run, problems, step)

    monkeypatch.setattr(loop, "generate_rollouts", killing(".generate", generate, lambda a: a[2]))
    monkeypatch.setattr(loop, "update_policy", killing(".scored_train_step", real_update, lambda a: at["step"]))
    monkeypatch.setattr(loop, "sync_weights", killing(".broadcast_weights", real_sync, lambda a: a[2]))
    said = []
    recipe = load_recipe("tiny-cpu", [*FAULT_RUN, "checkpoint.max_restarts=4"], steps=BASELINE_STEPS)
    run_recipe(recipe, tmp_path, say=said.append)

    assert [(step, k.seen) for step, k in killers] == [(s, KILLS[s][1]) for s in KILLS], said  # killed in the call
    rows = log_rows(tmp_path)
    restarts = [r for r in rows if r["kind"] == "restart"]
    assert [(r["step"], r["attempt"], r["resumed_from"], r["worker"], r["call"]) for r in restarts] == [
        (step, n, step - 1, worker, call) for n, (step, (worker, _, call)) in enumerate(KILLS.items(), start=1)]
    import json

    attempts = json.loads((tmp_path / "logs" / "workers.json").read_text())["attempts"]
    assert len(attempts) == 5
    for row, workers in zip(restarts, attempts):  # each cause names the step, the worker, its process and log
        dead = next(w for w in workers if w["name"] == row["worker"])
        assert row["cause"].startswith(f"step {row['step']}: {row['worker']} died during {row['call']}: ")
        assert row["cause"].endswith(f"[{row['worker']}: pid {dead['pid']} on {dead['host']}, its output: "
                                     f"{dead['log']}]") and dead["log"].endswith(f"-{dead['pid']}.err")
    sync = restarts[2]["cause"]  # the sender is named dead; a receiver that failed first names the bucket it lost
    assert "failed after it" not in sync or "failed after it: repro.sync.SyncError: weight sync v7: bucket " in sync
    assert numbers(rows) == numbers(fault_baseline)  # every train and eval row, once, with the same numbers
    assert wait_gone([w for workers in attempts for w in workers]) == []
    assert sum(line.startswith("restart ") for line in said) == 4
    print("\n" + "\n".join(said))  # what the user saw (pytest -s)
