"""Row bookkeeping for the embedded engine's decode loop: share a prompt's prefill across its samples, drop
finished rows from the batch, and put per-forward routing records back in place per response.

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


def select_rows(cache, index: torch.Tensor) -> None:
    """Keep rows ``index`` (int64 [R'], may repeat rows) of every layer of ``cache``, in that order, in place."""
    cache.reorder_cache(index)


class RoutingTable:
    """Per response row, the experts every recorded layer chose at every fed position.

    ``rows`` responses over ``positions`` fed positions (prompt, then one per decoding step). Each ``add`` writes
    one forward's record (layer -> [batch, seq, top_k], as ``RoutingRecorder.take`` gives) for the response rows
    that forward computed (``row_ids`` [batch], distinct), starting at position ``start``. Positions a row never fed stay -1 and are never handed out (``Trajectory.routing`` stops
    at the last fed position).
    """

    def __init__(self, rows: int, positions: int):
        self.rows, self.positions = rows, positions
        self.tables: dict[int, torch.Tensor] = {}

    def add(self, record: dict[int, torch.Tensor], row_ids: torch.Tensor, start: int) -> None:
        for layer, chosen in record.items():
            table = self.tables.get(layer)
            if table is None:
                table = self.tables[layer] = torch.full((self.rows, self.positions, chosen.shape[-1]), -1,
                                                        dtype=chosen.dtype)
            table[row_ids, start : start + chosen.shape[1]] = chosen
