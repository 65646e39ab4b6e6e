"""Log-probabilities and entropy of the sampling distribution from raw logits.

vLLM samples from softmax(logits / temperature); the trainer must score tokens under that same distribution,
so temperature divides the logits before log-softmax. Both functions compute in float32 even for bf16 logits,
because log-softmax over a 100k+ vocabulary loses most of its precision in bf16.
"""

from __future__ import annotations

import torch

from repro.algos.shapes import AlgoShapeError, require_rank


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if temperature <= 0:
        raise AlgoShapeError(f"temperature must be positive, got {temperature}")
    logits = logits.float()
    return logits / temperature if temperature != 1.0 else logits


def logprobs_from_logits(logits: torch.Tensor, token_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature)[token_ids].

    Args:
        logits: [B, T, V]. token_ids: [B, T] integer ids in [0, V).
    Returns:
        [B, T] float32, differentiable w.r.t. logits.
    """
    require_rank("logits", logits, 3)
    if token_ids.shape != logits.shape[:-1]:
        raise AlgoShapeError(
            f"shape mismatch: logits {tuple(logits.shape)} needs token_ids {tuple(logits.shape[:-1])}, "
            f"got token_ids {tuple(token_ids.shape)}"
        )
    scaled = _scaled(logits, temperature)
    # gather-minus-logsumexp avoids materialising the full [B, T, V] log-softmax.
    picked = scaled.gather(-1, token_ids.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(scaled, dim=-1)


def entropy_from_logits(
    logits: torch.Tensor, temperature: float = 1.0, chunk_size: int | None = None
) -> torch.Tensor:
    """Entropy H = logsumexp(z) - Σ_v softmax(z)_v · z_v of z = logits / temperature, per position.

    z is shifted by its max first: both terms are then O(1) instead of O(max z), so fp32 keeps full
    precision even for logits around 1e4 (unshifted, the two ~1e4 terms cancel to 3 digits). -inf logits
    (a masked vocabulary) are raised to the most negative finite float so that 0 · z stays 0, not NaN.

    Args:
        logits: [B, T, V].
        chunk_size: if given, process this many positions of T at a time to bound the [.., V] temporaries.
    Returns:
        [B, T] float32, differentiable w.r.t. logits.
    """
    require_rank("logits", logits, 3)
    if chunk_size is not None and chunk_size <= 0:
        raise AlgoShapeError(f"chunk_size must be positive, got {chunk_size} for logits {tuple(logits.shape)}")

    def one(block: torch.Tensor) -> torch.Tensor:
        z = _scaled(block, temperature)
        z = z - z.max(dim=-1, keepdim=True).values.detach()
        z = z.clamp(min=torch.finfo(z.dtype).min)
        probs = torch.softmax(z, dim=-1)
        return torch.logsumexp(z, dim=-1) - (probs * z).sum(dim=-1)

    if chunk_size is None or chunk_size >= logits.shape[1]:
        return one(logits)
    return torch.cat([one(block) for block in logits.split(chunk_size, dim=1)], dim=1)


def response_token_mean(values: torch.Tensor, response_mask: torch.Tensor) -> float:
    """Σ values·mask / Σ mask over every response token of the batch (LumenRL's ``entropy``: the token-weighted
    mean over all rows, not a mean of per-row means).

    Args:
        values: [B, T] (e.g. entropies of π_old). response_mask: [B, T] bool/0-1 with at least one valid token.
    Returns:
        a python float, accumulated in float64.
    """
    require_rank("values", values, 2)
    if values.shape != response_mask.shape:
        raise AlgoShapeError(
            f"shape mismatch: values {tuple(values.shape)}, response_mask {tuple(response_mask.shape)}")
    mask = response_mask.double()
    if float(mask.sum()) == 0:
        raise AlgoShapeError(f"response_mask {tuple(response_mask.shape)} has no valid token")
    return float((values.detach().double() * mask).sum() / mask.sum())
