"""Resume from the Megatron trainer's state format before dist_checkpointing (format 1): one
``repro.train.trainer_state`` safetensors folder per rank -- ``<directory>`` itself at world size 1,
``<directory>/rank-NNNNN`` above. Those files record no layout, so they load only onto the world that wrote them
(same rank count; the model check then refuses other shapes) and only into the project's AdamW, whose state they
hold; a GPU trainer (megatron's optimizer) is refused with the reason. Saving always writes the new format.
"""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from repro.train.base import StateParts, TrainerError


def load_old_format(trainer, folder: Path) -> None:
    from repro.train.megatron.model import load_weights
    from repro.train.megatron.optimizers import ProjectAdamW
    from repro.train.trainer_state import load_trainer

    world = dist.get_world_size() if dist.is_initialized() else 1
    ranks = sorted(p.name for p in folder.glob("rank-*")) if folder.is_dir() else []
    if not ranks and not (folder / "model.safetensors").is_file():
        raise TrainerError(f"{folder}: no Megatron trainer state here (neither trainer_state.json of format 2 "
                           "with dist/, nor the older per-rank model.safetensors / rank-NNNNN folders)")
    saved_world = len(ranks) or 1
    if saved_world != world:
        raise TrainerError(f"{folder}: per-rank state (the format before dist checkpoints) of {saved_world} rank(s); "
                           f"this world has {world}. That format loads onto the same layout only")
    if not isinstance(trainer.opt, ProjectAdamW):
        raise TrainerError(f"{folder}: per-rank state of the project's AdamW (the format before dist checkpoints); "
                           "this GPU trainer steps megatron's distributed optimizer, which cannot take it. Resume it "
                           "on the CPU lane, or start from the model weights")
    rank_dir = folder if world == 1 else folder / f"rank-{dist.get_rank():05d}"
    parts = StateParts(trainer.model, trainer.opt.inner, trainer.dtype_name, step=0, updates=0)
    trainer.step, trainer.updates = load_trainer(
        parts, rank_dir, backend="megatron",
        load_weights=lambda weights, source: load_weights(trainer.model, weights, source))
    trainer.resharded_from = None
