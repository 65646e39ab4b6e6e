"""Shape checks shared by the algorithm functions; every message names the argument and its shape."""

from __future__ import annotations

import torch

from repro.errors import ReproError


class AlgoShapeError(ReproError, ValueError):
    """A tensor handed to an algorithm function has the wrong rank or a shape that disagrees with another."""


def require_rank(name: str, tensor: torch.Tensor, rank: int) -> None:
    if tensor.dim() != rank:
        raise AlgoShapeError(f"{name} must have {rank} dims, got shape {tuple(tensor.shape)}")


def require_same_shape(**tensors: torch.Tensor) -> None:
    """All keyword tensors must share one shape; the message lists every name with its shape."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
        raise AlgoShapeError(f"shape mismatch: {listed}")


def as_float_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Response masks arrive as bool or int; arithmetic wants the dtype of the values they mask."""
    return mask.to(dtype=like.dtype if like.is_floating_point() else torch.float32)
