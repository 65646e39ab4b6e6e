"""Shape checks of a TrainBatch before a trainer runs it, so a mismatch fails naming the field, not deep in a
forward (a too-long routing table would otherwise replay silently shifted experts)."""

from __future__ import annotations

from repro.train.base import TrainerError
from repro.train.batch import TrainBatch


def check_batch(
    batch: TrainBatch, routers: dict, *, need_old: bool, replay: bool, caller: str
) -> None:
    """Raise TrainerError naming the field unless ``batch`` has the shapes ``caller`` needs.

    ``routers``: layer -> top-k router of the model (``repro.model.routing.topk_routers``); with ``replay`` every
    one of those layers needs a ``[B, T, top_k]`` routing table, T the width of ``input_ids``.
    """
    if batch.input_ids.dim() != 2:
        raise TrainerError(f"{caller}: batch.input_ids must be [B, T], got {tuple(batch.input_ids.shape)}")
    shape = tuple(batch.input_ids.shape)
    fields = {"targets": batch.targets, "response_mask": batch.response_mask,
              "rollout_logprobs": batch.rollout_logprobs}
    if need_old:
        if batch.old_logprobs is None:
            raise TrainerError(
                f"{caller}: batch.old_logprobs is None; set it to trainer.logprobs(batch).logprobs "
                "(the trainer's recompute before the update) first"
            )
        fields["old_logprobs"] = batch.old_logprobs
    for name, tensor in fields.items():
        if tuple(tensor.shape) != shape:
            raise TrainerError(f"{caller}: batch.{name} is {tuple(tensor.shape)}, want {shape} like input_ids")
    if tuple(batch.advantages.shape) != shape[:1]:
        raise TrainerError(f"{caller}: batch.advantages is {tuple(batch.advantages.shape)}, want [{shape[0]}]")
    if not replay:
        return
    if batch.routing is None:
        raise TrainerError(
            f"{caller}: routing replay asked for, but batch.routing is None (build the batch with "
            "with_routing=True from a rollout that records routing, or turn replay off)"
        )
    for layer, router in routers.items():
        table = batch.routing.get(layer)
        want = (*shape, router.top_k)
        if table is None or tuple(table.shape) != want:
            got = None if table is None else tuple(table.shape)
            raise TrainerError(f"{caller}: batch.routing[{layer}] is {got}, want {want} ([B, T, top_k])")
