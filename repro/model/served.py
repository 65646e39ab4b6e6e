"""The weights a model folder serves: the names, shapes and dtypes of its safetensors, which the trainer's export
must reproduce and every rollout engine checks an update against. Names travel with the checkpoint: a
DeepSeek-V4 folder in the release's layout is exported and checked in release names, one in transformers'
in-memory layout in those (``repro.model.layouts``); any other model in its state-dict names.

    served = served_weights(model)                 # recorded by load_tiny_model, else the model's state dict
    named = export_weights(served, model.state_dict())                   # trainer side
    check_update(served, dict(named), version, RolloutError)             # rollout side, before anything changes
    state = to_state_dict(served, dict(named))                           # back to the module's own names

The MTP layer (``mtp.*``) is in the folder but in no trainer, so it is left out of the synced set, and an update
that carries it is refused with the reason (``layouts.MTP_REASON``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from repro.fp8.inputs import INDEX, shard_files
from repro.fp8.safetensors_io import read_header
from repro.model import layouts

STATE_DICT = "state_dict"  # a non-DeepSeek-V4 model: the folder's names are the module's state-dict names
_ATTRIBUTE = "repro_served_weights"


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass
class ServedWeights:
    """Every tensor of a checkpoint (the release's reading order, else file order), its layout, and its source."""

    layout: str  # layouts.DEEPSEEK, layouts.HF or STATE_DICT
    tensors: dict[str, TensorSpec]
    source: str
    mtp: list[str] = field(default_factory=list)  # tensors in the folder that no sync carries

    @property
    def synced(self) -> dict[str, TensorSpec]:
        """What a weight update carries: every tensor except the MTP layer's."""
        left_out = set(self.mtp)
        return {n: s for n, s in self.tensors.items() if n not in left_out}


def served_from_headers(tensors: Mapping[str, TensorSpec], source: str, model_type: str | None) -> ServedWeights:
    names = list(tensors)
    if model_type == "deepseek_v4":
        layout = layouts.detect_layout(names, where=source)
        mtp = [n for n in names if layouts.is_mtp(n)]
        if layout == layouts.DEEPSEEK:  # the release's reading order, not safetensors' (by dtype, then name)
            tensors = {n: tensors[n] for n in layouts.release_order(names)}
    else:
        layout, mtp = STATE_DICT, []
    return ServedWeights(layout, dict(tensors), source, mtp)


def served_from_folder(folder: str | Path) -> ServedWeights:
    """Read every shard header of ``folder`` (no tensor data) and its config's model type."""
    import json

    folder = Path(folder)
    # transformers' loader reads the index's shards, or model.safetensors: a trainer state folder holds other
    # safetensors files beside it (optimizer.safetensors, rng.safetensors) that are no weights
    single = folder / "model.safetensors"
    files = [single] if single.is_file() and not (folder / INDEX).exists() else shard_files(folder)
    tensors = {}
    for path in files:
        infos, _ = read_header(path)
        tensors.update({t.name: TensorSpec(tuple(t.shape), t.dtype) for t in sorted(infos, key=lambda t: t.offset)})
    model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    return served_from_headers(tensors, str(folder), model_type)


def served_from_state_dict(model: torch.nn.Module) -> ServedWeights:
    """A model built in memory: its own state dict is what it serves (DeepSeek-V4: the ``hf`` layout)."""
    tensors = {n: TensorSpec(tuple(t.shape), t.dtype) for n, t in model.state_dict().items()
               if isinstance(t, torch.Tensor)}
    is_v4 = getattr(model.config, "model_type", None) == "deepseek_v4"
    return ServedWeights(layouts.HF if is_v4 else STATE_DICT, tensors, f"{type(model).__name__} state dict")


def record(model: torch.nn.Module, served: ServedWeights) -> None:
    """Attach ``served`` to ``model`` (copies made with copy.deepcopy keep it)."""
    setattr(model, _ATTRIBUTE, served)


def served_weights(model: torch.nn.Module) -> ServedWeights:
    """What ``model`` serves: the folder it was loaded from (``record``ed at load), else its own state dict."""
    return getattr(model, _ATTRIBUTE, None) or served_from_state_dict(model)


def export_weights(served: ServedWeights, state: Mapping[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """The module's ``state`` as ``served`` names it, in its order and dtypes: detached CPU copies.

    Every tensor goes out in the checkpoint's own dtype, so what the release keeps in FP32 (``layouts.STORED_FP32``)
    leaves as FP32 whatever the trainer computes in, and a BF16 tensor as BF16.
    """
    if served.layout == layouts.DEEPSEEK:
        named = layouts.to_release(state)
    else:
        named = dict(state)
    missing = [n for n in served.synced if n not in named]
    if missing:
        raise layouts.LayoutError(f"{served.source}: the model holds no tensor for {missing[:5]}")
    for name, spec in served.synced.items():
        tensor = named[name].detach().to("cpu")
        yield name, tensor.to(spec.dtype).contiguous().clone()


def check_update(served: ServedWeights, received: Mapping[str, torch.Tensor], version: int, error=ValueError,
                 partial: bool = False) -> None:
    """Raise ``error`` naming what is wrong with an update: missing (unless ``partial``: one bucket of a streamed
    update), unexpected (MTP: with why), shape, dtype, finite."""
    expected = served.synced
    missing = [] if partial else [n for n in expected if n not in received]
    unexpected = [n for n in received if n not in expected]
    if missing or unexpected:
        why = f" ({layouts.MTP_REASON})" if any(layouts.is_mtp(n) for n in unexpected) else ""
        raise error(
            f"weight update v{version}: missing tensors {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected tensors {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}{why} "
            f"(expected the {len(expected)} tensors of {served.source}, {served.layout} layout)"
        )
    for name, tensor in received.items():
        spec = expected[name]
        if tuple(tensor.shape) != spec.shape:
            raise error(f"weight update v{version}: tensor {name} has shape {tuple(tensor.shape)}, "
                        f"the model's is {spec.shape}")
        if tensor.dtype != spec.dtype:
            raise error(f"weight update v{version}: tensor {name} is {str(tensor.dtype).removeprefix('torch.')}, "
                        f"the checkpoint stores {str(spec.dtype).removeprefix('torch.')}")
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise error(f"weight update v{version}: tensor {name} holds NaN or Inf")


def to_state_dict(served: ServedWeights, received: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An update in ``served``'s names back in the module's own state-dict names."""
    if served.layout == layouts.DEEPSEEK:
        return layouts.from_release(received)
    return dict(received)
