"""The recipe's ``tracking`` section on LumenRL: W&B through LumenRL's own logger, TensorBoard from the stream.

LumenRL 2232f55 logs to W&B itself (``lumenrl/trainer/callbacks.py`` ``WandbCallback``, enabled by
``logger.wandb_enabled``; ``wandb.init(project, name, entity)`` from ``logger.wandb.*``, its own keys plus verl
aliases, step = its 0-based step + 1, so the same optimizer step as ours). It passes no mode, id or folder, so those
go through W&B's environment variables: ``WANDB_MODE``, ``WANDB_DIR`` (the run directory: its offline runs land in
``<run_dir>/wandb`` as ours do), and ``WANDB_RUN_ID`` + ``WANDB_RESUME=allow`` with the id kept in
``<run_dir>/wandb/run_id``, so a resumed LumenRL continues the same W&B run. What LumenRL sends again after a resume
is its own doing (online, W&B drops steps it already holds). Our own W&B sink is not used with LumenRL, so one
W&B run gets one writer. TensorBoard is fed from the rows ``repro.lumenrl.stream`` appends to metrics.jsonl, as on
our own loop; the rollouts on disk are not written (LumenRL's trajectories stay in its processes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from repro.recipes.schema import Recipe
from repro.run.sinks import wandb_run_id


def logger_settings(recipe: Recipe) -> dict[str, Any]:
    """LumenRL's ``logger.wandb*`` keys; off, only ``logger.wandb_enabled`` (the base file's names stay)."""
    wandb = recipe.tracking.wandb
    if not wandb.enabled:
        return {"logger.wandb_enabled": False}
    return {"logger.wandb_enabled": True, "logger.wandb.project": wandb.project, "logger.wandb.entity": wandb.entity,
            "logger.wandb.name": wandb.name or ""}  # "": LumenRL names the run itself (lumenrl-grpo)


def wandb_env(recipe: Recipe, run_dir: Path) -> dict[str, str]:
    """W&B's environment for LumenRL's logger (module docstring); empty when tracking.wandb is off."""
    wandb = recipe.tracking.wandb
    if not wandb.enabled:
        return {}
    return {"WANDB_MODE": wandb.mode, "WANDB_DIR": str(run_dir.resolve()), "WANDB_RUN_ID": wandb_run_id(run_dir),
            "WANDB_RESUME": "allow"}
