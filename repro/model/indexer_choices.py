"""Record and replay the Lightning Indexer's top-k choices of a DeepSeek-V4 model, as R3 does for the experts.

Compressed sparse attention (CSA) lets each query attend to ``index_topk`` of its compressed KV entries, the ones
the indexer scores highest. The choice is discrete, so the rollout's numerics (FP8 weights and activations, the
FP8 cache the indexer's compressed keys are read from) can make it keep other entries than the trainer's forward
keeps for the same token, just as a near-tie in the router makes it pick other experts. No engine replays these
choices; this module exists to measure how much of the mismatch they carry: record them in one forward, force
them in another, and count where two records disagree.

transformers 5.24's ``DeepseekV4Indexer.forward`` returns ``[batch, seq, k]`` int64 entry indices (k =
min(index_topk, compressed entries), ``-1`` for a pick past the causal limit); the CSA compressor turns them into
its block mask. A forward hook on every indexer records that output or replaces it. Replaying a model's own
record therefore gives bit-identical logits. Hooks are removed on exit; no class is patched.
"""

from __future__ import annotations

import torch

from repro.errors import ReproError
from repro.model.routing import LayerHooks


class IndexerError(ReproError):
    """Recorded or replayed indexer choices do not fit the model or the forward."""


def indexers(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """layer index -> the Lightning Indexer of that layer's CSA compressor, for every CSA layer of ``model``."""
    base = getattr(model, "model", model)
    found = {}
    for i, layer in enumerate(getattr(base, "layers", [])):
        compressor = getattr(getattr(layer, "self_attn", None), "compressor", None)
        indexer = getattr(compressor, "indexer", None)
        if indexer is not None:
            found[i] = indexer
    if not found:
        raise IndexerError(f"{type(model).__name__} has no compressed-sparse-attention layer with an indexer")
    return found


class IndexerChoices(LayerHooks):
    """``with IndexerChoices(model) as rec: model(...)`` records each CSA layer's choices (``rec.choices``:
    layer -> [batch, seq, k] int64, one forward); ``IndexerChoices(model, replay=choices)`` forces them instead.
    Replay needs one forward of the recorded batch and length (a full forward, as the rescoring and the trainer
    run); a forward of another shape raises, naming the layer."""

    def __init__(self, model: torch.nn.Module, replay: dict[int, torch.Tensor] | None = None):
        self.indexers = indexers(model)
        if replay is not None:
            missing = sorted(set(self.indexers) - set(replay))
            if missing:
                raise IndexerError(f"replayed indexer choices lack CSA layers {missing} (have {sorted(replay)})")
        self.replay = replay
        self.choices: dict[int, torch.Tensor] = {}
        self._handles: list = []

    def _hook(self, layer: int):
        def hook(module, args, output):
            if self.replay is None:
                if layer in self.choices:
                    raise IndexerError(f"layer {layer}: a second forward while recording (one forward per record)")
                self.choices[layer] = output.detach().to(torch.int64).clone()
                return output
            forced = self.replay[layer]
            if forced.shape != output.shape:
                raise IndexerError(f"layer {layer}: the forward's indexer output is {tuple(output.shape)}, "
                                   f"the replayed choices are {tuple(forced.shape)}")
            return forced.to(device=output.device, dtype=output.dtype)

        return hook

    def _hooked(self) -> dict[int, torch.nn.Module]:
        return self.indexers


def choice_disagreement(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where two records of one layer, [batch, seq, k] each, keep different entries.

    Returns (differs [batch, seq] bool: the sets of valid picks differ; swapped [batch, seq] int64: how many of
    a's valid picks b does not keep). Order inside a set is ignored (top-k order follows the scores, which the
    attention does not read); ``-1`` picks are not entries."""
    if a.shape != b.shape:
        raise IndexerError(f"indexer records of different shapes: {tuple(a.shape)} vs {tuple(b.shape)}")
    sa, sb = a.sort(dim=-1).values, b.sort(dim=-1).values
    differs = (sa != sb).any(dim=-1)
    # a pick of a is kept by b when it equals one of b's; -1 never counts as an entry
    kept = (a.unsqueeze(-1) == b.unsqueeze(-2)).any(dim=-1)
    swapped = ((a >= 0) & ~kept).sum(dim=-1)
    return differs, swapped
