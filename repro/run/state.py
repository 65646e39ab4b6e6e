"""Everything one run holds between steps: long-lived handles only (the groups, the data, the log).

The two groups are reached through ``repro.groups.protocol``: in this process (``repro.groups.workers``) or as
Ray actors (``repro.groups.ray_groups``); the loop cannot tell which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from repro.data.records import MathProblem
from repro.data.sampler import PromptSampler
from repro.groups.protocol import RolloutGroup, TrainerGroup
from repro.recipes.schema import Recipe
from repro.run.metrics_log import MetricsLog
from repro.run.rollouts_file import NoRollouts, RolloutSink

Progress = Callable[[int, dict], None]


def no_progress(step: int, row: dict) -> None:
    """The default progress sink: nothing (the CLI passes a tqdm bar, notebook 03 a live plot)."""


@dataclass
class Run:
    recipe: Recipe
    run_dir: Path
    trainer: TrainerGroup
    rollout: RolloutGroup
    tokenizer: Any
    train_problems: list[MathProblem]
    train_prompt_ids: list[list[int]]
    eval_problems: list[MathProblem]
    eval_prompt_ids: list[list[int]]
    sampler: PromptSampler
    metrics: MetricsLog
    rollouts: RolloutSink = field(default_factory=NoRollouts)  # each step's trajectories (tracking.rollouts)
    start_step: int = 0
    progress: Progress = field(default=no_progress)
    warmup_s: float | None = None  # starting the groups; logged once, on the first row this process writes

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"
