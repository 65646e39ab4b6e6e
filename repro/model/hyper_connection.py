"""DeepSeek-V4's hyper-connection weights computed entry by entry: transformers' numbers, a fraction of its ops' cost.

transformers 5.24's ``DeepseekV4HyperConnection`` makes its ``[..., N, N]`` mixing matrix doubly stochastic with
20 Sinkhorn-Knopp iterations (mHC, Xie et al., 2026; DeepSeek-V4 report §2.2), each a ``sum(dim, keepdim=True)``
and a broadcast division over a trailing dimension of N = ``hc_mult`` (2 in the tiny model, 4 in V4-Flash). On a
CPU such an op costs ~100 µs at a trainer batch's shape whatever its size (the inner loop is N long), and
autograd records six of them per iteration: the loop was ~25% of the tiny model's forward + backward.

Here the matrix is kept as N² contiguous tensors, one per entry, so every sum is N - 1 plain additions and every
division a plain elementwise one. Each entry is computed by the same IEEE operations in the same order as the
library's (torch sums a dimension of N <= 4 left to right, as these additions do -- the tests check it for N = 2
and 4 on the shapes the trainer and the engine use), so the forward is bit-identical, and autograd's backward
differentiates the same formula with cheaper ops: bit-identical gradients too for N = 2 (the tiny model; a sum
is one addition), within 1-2 ulps for N = 4 (autograd adds a 4-term sum's gradients in another order). For
N > 4 torch's reduction order differs and the library's own forward is kept.

The whole loop is one compiled call (``repro.fp8.forward_ops``: the same additions and divisions per entry, so
the same bits) instead of ~1,250 ops per hyper-connection at N = 4; under autograd its backward is one call too,
autograd's own backward of these ops written out in the same order (same bits, tests/test_forward_ops.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection

from repro.fp8 import forward_ops

MAX_ENTRYWISE_STREAMS = 4  # up to here torch's sum over the dimension adds left to right (tested)


def _normalise(entries: list[list[torch.Tensor]], by_rows: bool, eps: float) -> list[list[torch.Tensor]]:
    """Divide each row (``by_rows``) or column of the N x N grid of tensors by its sum + eps."""
    n = len(entries)
    out = [[None] * n for _ in range(n)]
    for a in range(n):
        line = [entries[a][b] if by_rows else entries[b][a] for b in range(n)]
        total = line[0]
        for value in line[1:]:
            total = total + value
        total = total + eps
        for b, value in enumerate(line):
            if by_rows:
                out[a][b] = value / total
            else:
                out[b][a] = value / total
    return out


def sinkhorn_entrywise(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Sinkhorn-Knopp normalisation as transformers' DeepSeek-V4 runs it, one tensor per matrix entry.

    comb: [..., N, N] positive (softmax + eps). Columns are normalised first, then ``iters - 1`` times rows and
    columns, each dividing by (sum + eps). Returns [..., N, N] in comb's dtype, bit-identical to the library's loop
    for N <= ``MAX_ENTRYWISE_STREAMS``.
    """
    n = comb.shape[-1]
    if comb.shape[-2] != n:
        raise ValueError(f"sinkhorn_entrywise: comb must be [..., N, N], got shape {tuple(comb.shape)}")
    if torch.is_grad_enabled() and comb.requires_grad:
        fused = forward_ops.sinkhorn_with_grad(comb, iters, eps)
    else:
        fused = forward_ops.sinkhorn(comb, iters, eps)
    if fused is not None:
        return fused
    entries = [[row[..., j].contiguous() for j in range(n)] for row in comb.unbind(-2)]
    entries = _normalise(entries, by_rows=False, eps=eps)
    for _ in range(iters - 1):
        entries = _normalise(entries, by_rows=True, eps=eps)
        entries = _normalise(entries, by_rows=False, eps=eps)
    return torch.stack([torch.stack(row, dim=-1) for row in entries], dim=-2)


def collapse_streams(pre: torch.Tensor, hidden_streams: torch.Tensor) -> torch.Tensor:
    """sum_i pre[..., i] * hidden_streams[..., i, :], added left to right: [B, S, N], [B, S, N, D] -> [B, S, D]
    (in the promoted dtype, as ``(pre.unsqueeze(-1) * hidden_streams).sum(dim=2)``)."""
    total = pre[..., 0:1] * hidden_streams[..., 0, :]
    for i in range(1, pre.shape[-1]):
        total = total + pre[..., i : i + 1] * hidden_streams[..., i, :]
    return total


class EntrywiseHyperConnection(DeepseekV4HyperConnection):
    """``DeepseekV4HyperConnection`` with the Sinkhorn loop and the stream collapse entry by entry (same outputs)."""

    def forward(self, hidden_streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """hidden_streams [B, S, N, D] -> (post [B, S, N], comb [B, S, N, N], collapsed [B, S, D])."""
        if self.hc_mult > MAX_ENTRYWISE_STREAMS:
            return super().forward(hidden_streams)
        batch, seq, n = hidden_streams.shape[0], hidden_streams.shape[1], self.hc_mult
        mixes = F.linear(self.input_norm(hidden_streams.view(batch, seq, -1).float()), self.fn.float())
        pre_w, post_w, comb_w = mixes.split([n, n, n * n], dim=-1)
        pre_b, post_b, comb_b = self.base.split([n, n, n * n])
        pre_scale, post_scale, comb_scale = self.scale.unbind(0)
        pre = torch.sigmoid(pre_w * pre_scale + pre_b) + self.hc_eps
        post = 2 * torch.sigmoid(post_w * post_scale + post_b)
        comb_logits = comb_w.view(*comb_w.shape[:-1], n, n) * comb_scale + comb_b.view(n, n)
        comb = torch.softmax(comb_logits, dim=-1) + self.hc_eps
        comb = sinkhorn_entrywise(comb, self.hc_sinkhorn_iters, self.hc_eps)
        return post, comb, collapse_streams(pre, hidden_streams).to(hidden_streams.dtype)


def use_entrywise_hyper_connections(model: torch.nn.Module) -> int:
    """Switch every ``DeepseekV4HyperConnection`` of ``model`` (in place, this instance only) to
    ``EntrywiseHyperConnection``; returns how many were switched (0 for a model without hyper-connections)."""
    switched = 0
    for module in model.modules():
        if type(module) is DeepseekV4HyperConnection:
            module.__class__ = EntrywiseHyperConnection
            switched += 1
    return switched
