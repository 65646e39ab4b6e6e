"""Trajectories -> the padded tensors a trainer consumes, and token-budget micro-batches.

Alignment: a row of ``P`` prompt and ``R`` response tokens feeds its first ``P + R - 1`` tokens and predicts
the next one at each position, so position ``t`` scores token ``t + 1`` and the response is scored at
``t = P - 1 .. P + R - 2``. The rollout records routing at exactly the fed positions, so it lines up 1:1.
Rows are right-padded; the model is causal, so padding never changes an earlier position.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from repro.errors import ReproError
from repro.rollout.types import Trajectory


@dataclass
class TrainBatch:
    input_ids: torch.Tensor          # [B, T] int64, fed tokens, right-padded with pad_id
    targets: torch.Tensor            # [B, T] int64, the token each position predicts (pad where invalid)
    response_mask: torch.Tensor      # [B, T] bool, positions whose target is a response token
    rollout_logprobs: torch.Tensor   # [B, T] float32, rollout engine's log-prob of each target (0 off-response)
    advantages: torch.Tensor         # [B] float32, one per sequence
    routing: dict[int, torch.Tensor] | None  # layer -> [B, T, top_k] int64 recorded experts, or None
    old_logprobs: torch.Tensor | None = None  # [B, T] float32, trainer's recompute before the update

    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, index: torch.Tensor | slice) -> "TrainBatch":
        """The sub-batch of the given rows, trimmed to its own longest row."""
        picked = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, dict):
                value = {k: v[index] for k, v in value.items()}
            elif value is not None:
                value = value[index]
            picked[f.name] = value
        sub = replace(self, **picked)
        return sub.trimmed()

    def to(self, device: torch.device) -> "TrainBatch":
        """The same batch with every tensor (routing tables included) on ``device``; itself where all are there."""
        moved = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, dict):
                value = {k: v.to(device) for k, v in value.items()}
            elif value is not None:
                value = value.to(device)
            moved[f.name] = value
        return replace(self, **moved)

    def trimmed(self) -> "TrainBatch":
        """Drop trailing columns that hold no response position of any row."""
        valid_cols = self.response_mask.any(dim=0).nonzero()
        width = int(valid_cols.max()) + 1 if len(valid_cols) else self.input_ids.shape[1]
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "advantages" or value is None:
                out[f.name] = value
            elif isinstance(value, dict):
                out[f.name] = {k: v[:, :width] for k, v in value.items()}
            else:
                out[f.name] = value[:, :width]
        return replace(self, **out)


def build_batch(
    trajectories: list[Trajectory], advantages: torch.Tensor, pad_id: int, with_routing: bool = True
) -> TrainBatch:
    """Stack trajectories into one right-padded batch. ``advantages``: [B] in trajectory order."""
    if not trajectories:
        raise ReproError("build_batch: no trajectories")
    if advantages.shape != (len(trajectories),):
        raise ReproError(f"build_batch: advantages shape {tuple(advantages.shape)}, want [{len(trajectories)}]")
    width = max(t.num_tokens for t in trajectories) - 1
    rows = len(trajectories)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.int64)
    targets = torch.full((rows, width), pad_id, dtype=torch.int64)
    mask = torch.zeros((rows, width), dtype=torch.bool)
    rollout_lp = torch.zeros((rows, width), dtype=torch.float32)
    routing = None
    if with_routing:
        layers = trajectories[0].routing
        if not layers:
            raise ReproError("build_batch: routing replay asked for, but the rollout recorded no routing")
        routing = {k: torch.zeros((rows, width, v.shape[-1]), dtype=torch.int64) for k, v in layers.items()}
    for i, traj in enumerate(trajectories):
        tokens = torch.tensor(traj.prompt_ids + traj.response_ids, dtype=torch.int64)
        fed, prompt_len, resp_len = len(tokens) - 1, len(traj.prompt_ids), len(traj.response_ids)
        if traj.logprobs.shape != (resp_len,):
            raise ReproError(f"trajectory {i}: {tuple(traj.logprobs.shape)} logprobs for {resp_len} response tokens")
        input_ids[i, :fed] = tokens[:-1]
        targets[i, :fed] = tokens[1:]
        mask[i, prompt_len - 1 : fed] = True
        rollout_lp[i, prompt_len - 1 : fed] = traj.logprobs.float()
        if routing is not None:
            for layer, table in routing.items():
                recorded = traj.routing.get(layer)
                if recorded is None or recorded.shape[0] != fed:
                    got = None if recorded is None else tuple(recorded.shape)
                    raise ReproError(f"trajectory {i}: routing of layer {layer} is {got}, want [{fed}, top_k]")
                table[i, :fed] = recorded
    return TrainBatch(input_ids, targets, mask, rollout_lp, advantages.float(), routing)


def micro_batches(batch: TrainBatch, max_tokens: int) -> list[TrainBatch]:
    """Consecutive row groups whose padded size (rows x own width) stays within ``max_tokens``."""
    widths = batch.response_mask.int().cumsum(dim=1).argmax(dim=1) + 1  # last response position + 1 per row
    groups, start, widest = [], 0, 0
    for row in range(batch.num_rows):
        widest_with_row = max(widest, int(widths[row]))
        if row > start and widest_with_row * (row - start + 1) > max_tokens:
            groups.append(slice(start, row))
            start, widest_with_row = row, int(widths[row])
        widest = widest_with_row
    groups.append(slice(start, batch.num_rows))
    return [batch.rows(g) for g in groups]


def padded_to_multiple(batch: TrainBatch, multiple: int) -> TrainBatch:
    """``batch`` with its width right-padded to a multiple of ``multiple`` (sequence parallelism splits the
    sequence evenly over TP ranks); see ``padded_to_shape``."""
    width = batch.input_ids.shape[1]
    return padded_to_shape(batch, batch.num_rows, width + (-width % multiple))


def padded_to_shape(batch: TrainBatch, rows: int, width: int) -> TrainBatch:
    """``batch`` grown to ``rows`` x ``width``: padded positions and rows are off-response, with zero ids,
    log-probs, advantages and experts, so they add nothing to a loss; the model is causal, so right padding
    changes no earlier position."""
    have_rows, have_width = batch.input_ids.shape
    if rows < have_rows or width < have_width:
        raise ReproError(f"padded_to_shape: cannot shrink [{have_rows}, {have_width}] to [{rows}, {width}]")
    if (rows, width) == (have_rows, have_width):
        return batch

    def pad(tensor: torch.Tensor, token_dims: bool = True) -> torch.Tensor:
        shape = (rows, width, *tensor.shape[2:]) if token_dims else (rows,)
        out = torch.zeros(shape, dtype=tensor.dtype)
        if token_dims:
            out[:have_rows, :have_width] = tensor
        else:
            out[:have_rows] = tensor
        return out

    out = {}
    for f in fields(batch):
        value = getattr(batch, f.name)
        if value is None:
            out[f.name] = value
        elif f.name == "advantages":
            out[f.name] = pad(value, token_dims=False)
        elif isinstance(value, dict):
            out[f.name] = {k: pad(v) for k, v in value.items()}
        else:
            out[f.name] = pad(value)
    return replace(batch, **out)
