"""Everything one run holds between steps, and the two ways a worker group is reached.

A group is anything with ``call(method, *args)`` (run it, return the result) and ``submit(method, *args)``
(start it; the result may be handed straight to another group's ``call``, which with Ray moves the data
worker-to-worker without passing through the driver). ``LocalGroup`` runs in-process (tests);
``repro.cluster`` provides the Ray-backed group the CLI uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from repro.recipes.schema import Recipe
from repro.data.records import MathProblem
from repro.data.sampler import PromptSampler
from repro.run.metrics_log import MetricsLog


class Group(Protocol):
    def call(self, method: str, *args: Any) -> Any: ...

    def submit(self, method: str, *args: Any) -> Any: ...


class LocalGroup:
    """A worker object in this process, behind the group interface."""

    def __init__(self, worker: Any, name: str):
        self.worker, self.name = worker, name

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.worker, method)(*args)

    submit = call


def no_progress(step: int, row: dict) -> None:
    """The default progress sink: nothing (the CLI passes a tqdm bar instead)."""


@dataclass
class Run:
    recipe: Recipe
    run_dir: Path
    trainer: Group
    rollout: Group
    tokenizer: Any
    train_problems: list[MathProblem]
    train_prompt_ids: list[list[int]]
    eval_problems: list[MathProblem]
    eval_prompt_ids: list[list[int]]
    sampler: PromptSampler
    metrics: MetricsLog
    start_step: int = 0
    progress: Callable[[int, dict], None] = field(default=no_progress)

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"
