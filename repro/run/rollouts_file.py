"""The rollouts on disk: every step's trajectories in ``rollouts/step_NNNNNN.jsonl.gz``, one JSON record a line.

A record holds what one reaches for when a metric moves: the prompt and response as text, the reward, the GRPO
advantage, the length and why the response ended, and the trajectory's mismatch -- the sums of the rollout's and
the trainer's log-probs of its tokens, their per-sequence k3 KL, the largest per-token gap (with its position and
token) and the share of its tokens above the TIS cap (``repro.algos.sequence_mismatch``). Records are in the
batch's order (prompt-major, ``i`` 0..n-1), so ``group`` / ``sample`` place each in its GRPO group.

A step's file is written whole to a temporary name and renamed, so a file is complete or absent; a step a resumed
run recomputes is written again over the crashed attempt's. Reading checks gzip's own end marker and every line,
and names the file and line of the first fault (:func:`read_rollouts`).
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from repro.algos import sequence_mismatch
from repro.data.records import MathProblem
from repro.errors import ReproError
from repro.reward import RewardResult
from repro.rollout.types import RolloutResult
from repro.run.sinks import ROLLOUTS_DIR
from repro.train.batch import TrainBatch

FIELDS = ("i", "group", "sample", "prompt", "response", "answer", "score", "acc", "advantage", "length", "finish",
          "rollout_logprob_sum", "trainer_logprob_sum", "k3_kl", "max_gap", "max_gap_position", "max_gap_token",
          "above_cap_share")


def rollouts_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / ROLLOUTS_DIR / f"step_{step:06d}.jsonl.gz"


@dataclass(frozen=True)
class StepTrajectories:
    """One step's trajectories with what was made of them: the prompts' problems (one per prompt), the rewards
    (one per trajectory) and the trained batch, its ``old_logprobs`` set (row i = trajectory i)."""

    problems: list[MathProblem]
    rollout: RolloutResult
    rewards: list[RewardResult]
    batch: TrainBatch


def rollout_records(step: StepTrajectories, tokenizer, cap: float) -> list[dict[str, Any]]:
    """The records of one step (module docstring); ``cap`` is the TIS cap C the share above it is counted at."""
    batch = step.batch
    seq = sequence_mismatch(batch.old_logprobs, batch.rollout_logprobs, batch.response_mask, cap)
    records = []
    for i, (traj, reward) in enumerate(zip(step.rollout.trajectories, step.rewards, strict=True)):
        position = int(seq.max_gap_position[i])
        records.append({
            "i": i, "group": traj.prompt_index, "sample": traj.sample_index,
            "prompt": tokenizer.decode(traj.prompt_ids, skip_special_tokens=True),
            "response": tokenizer.decode(traj.response_ids, skip_special_tokens=True),
            "answer": step.problems[traj.prompt_index].ground_truth,
            "score": reward.score, "acc": bool(reward.acc), "advantage": float(batch.advantages[i]),
            "length": len(traj.response_ids), "finish": traj.finish_reason.value,
            "rollout_logprob_sum": float(seq.rollout_logprob_sum[i]),
            "trainer_logprob_sum": float(seq.trainer_logprob_sum[i]),
            "k3_kl": float(seq.k3_kl[i]), "max_gap": float(seq.max_abs_gap[i]), "max_gap_position": position,
            "max_gap_token": tokenizer.decode([traj.response_ids[position]]) if position >= 0 else "",
            "above_cap_share": float(seq.above_cap_share[i]),
        })
    return records


def write_rollouts(path: Path, records: list[dict[str, Any]]) -> Path:
    """``records`` as gzipped JSON lines at ``path``, written to a temporary name and renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    # mtime 0: the same records give the same bytes (a recomputed step's file is comparable with the crashed one's)
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as handle:
        handle.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode())
    tmp.replace(path)
    return path


def read_rollouts(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a step's file. A file cut short, not gzip, or with a line that is not a complete record
    in its place raises, naming the file and the line; nothing is skipped."""
    path = Path(path)
    if not path.is_file():
        raise ReproError(f"{path}: no such rollouts file")
    records: list[dict[str, Any]] = []
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                records.append(_record(path, number, line))
    except (EOFError, gzip.BadGzipFile, zlib.error, UnicodeDecodeError) as err:
        raise ReproError(f"{path}:{len(records) + 1}: unreadable from this line on, the file is cut short or "
                         f"damaged ({err})") from None
    return records


def _record(path: Path, number: int, line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ReproError(f"{path}:{number}: not a JSON record ({err.msg})") from None
    if not isinstance(record, dict):
        raise ReproError(f"{path}:{number}: not a JSON object")
    missing = [f for f in FIELDS if f not in record]
    if missing:
        raise ReproError(f"{path}:{number}: record lacks {', '.join(missing)}")
    if record["i"] != number - 1:
        raise ReproError(f"{path}:{number}: record i={record['i']} where {number - 1} belongs (lines lost or repeated)")
    return record


def rollout_steps(run_dir: str | Path) -> list[int]:
    """The steps whose rollouts file exists, in order."""
    folder = Path(run_dir) / ROLLOUTS_DIR
    steps = []
    for path in folder.glob("step_*.jsonl.gz"):
        number = path.name.removeprefix("step_").removesuffix(".jsonl.gz")
        if number.isdigit():
            steps.append(int(number))
    return sorted(steps)


class RolloutSink(Protocol):
    def write(self, step: int, trajectories: StepTrajectories) -> None: ...


class NoRollouts:
    """tracking.rollouts off: nothing is built or written."""

    def write(self, step: int, trajectories: StepTrajectories) -> None:
        pass


class RolloutsDir:
    """tracking.rollouts on: each step's records to ``rollouts/step_NNNNNN.jsonl.gz`` under ``run_dir``."""

    def __init__(self, run_dir: Path, tokenizer, cap: float):
        self.run_dir, self.tokenizer, self.cap = run_dir, tokenizer, cap

    def write(self, step: int, trajectories: StepTrajectories) -> None:
        write_rollouts(rollouts_path(self.run_dir, step), rollout_records(trajectories, self.tokenizer, self.cap))
