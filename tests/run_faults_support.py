"""What the fault tests share: a small recipe, the rows they compare, and a wait for processes to be gone.

The recipe is test_loop_resume's SMALL made cheaper (4 prompts, one sample per held-out problem); evaluations and
checkpoints every 2 steps, so a run of N steps logs exactly the first rows of the 10-step baseline's log (no
number depends on the run's length), and a fault at an odd step resumes from the checkpoint just before it.
Every run of these tests uses one torch thread (``CLI_ENV`` for a command started as a process), as the baseline
does (tests/conftest.py ``fault_baseline``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

FAULT_RUN = [
    "algorithm.prompts_per_step=4", "lengths.max_response=12", "eval.samples_per_problem=1", "eval.every_steps=2",
    "checkpoint.every_steps=2", "checkpoint.keep_last=2",
]
BASELINE_STEPS = 10
CLI_ENV = dict(os.environ, RAY_AUTH_MODE="disabled", OMP_NUM_THREADS="1")
# The keys measured in seconds (or derived from them): a resumed run recomputes every other number bit for bit.
WALL_CLOCK = ("timing_s/", "perf/rollout_tokens_per_s", "weight_sync/gbps", "weight_sync/seconds")


def numbers(rows: list[dict], last_step: int | None = None) -> list[dict]:
    """The train and eval rows (up to ``last_step``) without their wall-clock keys."""
    return [{k: v for k, v in r.items() if not k.startswith(WALL_CLOCK)} for r in rows
            if r["kind"] in ("train", "eval") and (last_step is None or r["step"] <= last_step)]


def log_rows(run_dir: Path) -> list[dict]:
    """Every row of the run's log, read strictly: a torn or corrupt line fails the test."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def alive(processes: list[dict]) -> list[int]:
    """The recorded processes (pid and start time) still running."""
    import psutil

    found = []
    for p in processes:
        try:
            if abs(psutil.Process(p["pid"]).create_time() - p["create_time"]) < 1e-3:
                found.append(p["pid"])
        except psutil.NoSuchProcess:
            pass
    return found


def wait_gone(processes: list[dict], timeout_s: float = 30.0) -> list[int]:
    deadline = time.time() + timeout_s
    while alive(processes) and time.time() < deadline:
        time.sleep(0.2)
    return alive(processes)
