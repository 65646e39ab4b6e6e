"""Row bookkeeping for the embedded engine's decode loop: responses that have so far sampled the same tokens
after the same prompt share one batch row, and a response leaves the batch once it sampled EOS.

A prompt's ``n`` responses start out identical, so its prefill runs once; at every step the responses on one
batch row ("node") that draw the same token stay on one row, those that draw different tokens branch onto rows
of their own (a prefix tree, like vLLM's prefix caching or SGLang's radix cache, inside one batch). Two responses
with the same history get the same cache state and logits, so sharing the row changes no number: each response
still samples its own token from those logits with its own draw. How much it saves depends on the sampling:
where the ``n`` samples diverge at the first token it saves the prefill only.

Rows of a transformers ``DynamicCache`` are moved with ``Cache.reorder_cache`` (the beam-search hook), not with
``batch_select_indices`` / ``batch_repeat_interleave``: transformers 5.24's DeepSeek-V4 cache layers
(``DeepseekV4HCACache``, ``DeepseekV4CSACache``) override only ``reorder_cache`` to carry their compressor state
(the window buffer, the compressed entries, and the CSA overlap slice, for the compressor and the indexer) along
with the sliding-window K=V; the other two hooks would move the K=V alone and leave that state on the old rows.
Every DeepSeek-V4 layer type can be row-selected and expanded this way; what is not per row (``entry_count``, the
window position, ``cumulative_length``) is the same for every row, as all rows of a decode batch advance in step.
"""

from __future__ import annotations

import torch


def select_rows(cache, index: torch.Tensor, batch: int) -> None:
    """Make row i of every layer of ``cache`` (``batch`` rows now) a copy of old row ``index[i]`` (int64 [B'],
    rows may repeat or go), in place; nothing is copied when ``index`` keeps every row where it is."""
    if len(index) == batch and torch.equal(index, torch.arange(batch)):
        return
    cache.reorder_cache(index)


def branch(node: torch.Tensor, token: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The next step's batch rows after each response on batch row ``node[r]`` sampled ``token[r]``.

    Args: node, token: int64 [R], one entry per live response. Responses on the same row that drew the same token
    still share a history, so they get one row. Returns (parent [B'], fed [B'], node [R]): new row j continues old
    row ``parent[j]`` with token ``fed[j]``; response r now reads new row ``node[r]``. Rows come sorted by
    (parent, token), so the result depends on the tokens only.
    """
    unique, node = torch.unique(node * vocab + token, return_inverse=True)
    return unique // vocab, unique % vocab, node


class RoutingTable:
    """Per response row, the experts every recorded layer chose at every fed position.

    ``rows`` responses over ``positions`` fed positions (prompt, then one per decoding step). Each ``add`` writes
    one forward's record (layer -> [batch, seq, top_k], as ``RoutingRecorder.take`` gives) for the responses
    ``row_ids`` [R] (distinct), response ``row_ids[r]`` having read batch row ``node[r]``, starting at position
    ``start``. Positions a response never fed stay -1 and are never handed out (``Trajectory.routing`` stops at
    the last fed position).
    """

    def __init__(self, rows: int, positions: int):
        self.rows, self.positions = rows, positions
        self.tables: dict[int, torch.Tensor] = {}

    def add(self, record: dict[int, torch.Tensor], row_ids: torch.Tensor, node: torch.Tensor, start: int) -> None:
        for layer, chosen in record.items():
            table = self.tables.get(layer)
            if table is None:
                table = self.tables[layer] = torch.full((self.rows, self.positions, chosen.shape[-1]), -1,
                                                        dtype=chosen.dtype)
            table[row_ids, start : start + chosen.shape[1]] = chosen[node]
