"""The weight sync through vLLM's own weight-transfer engine (``vllm.distributed.weight_transfer``): the GPU path
where one trainer rank sends (``uses_vllm_transfer`` in ``repro.rollout.vllm_args`` decides).

vLLM's engine is LumenRL's scheme: the trainer is rank 0 of one NCCL group (RCCL on ROCm) with every vLLM worker
at ranks 1..R, and broadcasts the weights packed into flat device buffers of ``weight_sync.bucket_mb``, two of
them in flight (``packed_num_buffers``); each worker cuts the same buffers back into tensors from the update info
(names, dtype names, shapes, in send order) and hands them to the model's ``load_weights`` between its
``start_weight_update`` and ``finish_weight_update`` (vLLM's layerwise reload, re-quantising to FP8 per layer).

The two vLLM versions this meets differ in where the packing settings ride, and in the trainer's call:

* 0.25.1 (AMD's image): ``NCCLWeightTransferEngine.trainer_send_weights(iterator, NCCLTrainerSendWeightsArgs(
  group, packed=True, packed_buffer_size_bytes, packed_num_buffers))``; ``packed`` and the buffer geometry travel
  in ``NCCLWeightTransferUpdateInfo``; ``NCCLWeightTransferInitInfo`` is (master_address, master_port,
  rank_offset, world_size).
* 0.32: ``trainer_send_weights`` is gone; ``NCCLTrainerWeightTransferEngine.send_weights`` drives the rollout's
  RPCs itself through a client, which here is the driver's job, so the trainer calls the broadcast that engine
  calls when packed, ``packed_tensor.packed_nccl_broadcast_producer``; the packing settings moved into the
  (keyword-only) ``NCCLWeightTransferInitInfo``, the update info keeps names, dtype names and shapes.

Both sides build their payloads from one ``TransferAddress``, which carries the update info: the served
checkpoint's synced tensors in the trainer's order. The trainer checks its stream against it tensor by tensor
before packing each one (a disagreement would cut the buffers differently on the two sides); the rollout checks
it against its served checkpoint before anything changes. No checksum: vLLM's wire carries none, and the bytes
never leave the devices; the all-or-nothing gate is kept by the engine (``VLLMEngine.receive_transfer``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Protocol

import torch

from repro.devices import current_accelerator, settle
from repro.model.served import ServedWeights, served_from_folder
from repro.sync.apply import SyncStats
from repro.sync.errors import SyncError
from repro.sync.group import free_address
from repro.sync.stream import WIRE_DTYPES

if TYPE_CHECKING:
    from pathlib import Path

    from repro.recipes.schema import Recipe
    from repro.sync.bucket_wire import BucketWire

NUM_BUFFERS = 2  # vLLM's default double buffering: one buffer packs while the other is on the wire


@dataclass(frozen=True)
class TransferAddress:
    """Where vLLM's weight-transfer group meets, and what each sync carries (its update info): plain values."""

    host: str
    port: int
    receivers: int                              # vLLM workers (every TP rank); the group is 1 + receivers
    bucket_bytes: int
    names: tuple[str, ...]
    dtypes: tuple[str, ...]                     # torch dtype names without "torch."
    shapes: tuple[tuple[int, ...], ...]
    num_buffers: int = NUM_BUFFERS

    @property
    def world(self) -> int:
        return 1 + self.receivers

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(s, d) for s, d in zip(self.shapes, self.dtypes))


def _nbytes(shape: tuple[int, ...], dtype: str) -> int:
    return torch.Size(shape).numel() * torch.empty(0, dtype=WIRE_DTYPES[dtype]).element_size()


def transfer_address(host: str, port: int, receivers: int, bucket_bytes: int, served: ServedWeights
                     ) -> TransferAddress:
    """The address for a served checkpoint: its synced tensors, in its order (the trainer's export order)."""
    synced = served.synced
    return TransferAddress(host, port, receivers, bucket_bytes, tuple(synced),
                           tuple(str(s.dtype).removeprefix("torch.") for s in synced.values()),
                           tuple(tuple(s.shape) for s in synced.values()))


def packed_in_init_info() -> bool:
    """Whether the installed vLLM takes the packing settings at the handshake (0.32) or per update (0.25.1)."""
    from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo

    return "packed" in {f.name for f in dataclasses.fields(NCCLWeightTransferInitInfo)}


def _packing(address: TransferAddress) -> dict[str, Any]:
    return {"packed": True, "packed_buffer_size_bytes": address.bucket_bytes,
            "packed_num_buffers": address.num_buffers}


def worker_init_info(address: TransferAddress, packed_at_init: bool) -> dict[str, Any]:
    """``LLM.init_weight_transfer_engine``'s init_info: the workers join at ranks 1.. (vLLM adds its rank)."""
    info = {"master_address": address.host, "master_port": address.port, "rank_offset": 1,
            "world_size": address.world}
    return {**info, **_packing(address)} if packed_at_init else info


def update_info(address: TransferAddress, packed_at_init: bool) -> dict[str, Any]:
    """``LLM.update_weights``'s update_info: names, dtype names and shapes in send order (+ packing on 0.25.1)."""
    info = {"names": list(address.names), "dtype_names": list(address.dtypes),
            "shapes": [list(s) for s in address.shapes]}
    return info if packed_at_init else {**info, **_packing(address)}


def packed_buckets(address: TransferAddress) -> int:
    """How many buffers vLLM's packer fills: it closes one once its bytes exceed ``bucket_bytes``."""
    count, used = 0, 0
    for shape, dtype in zip(address.shapes, address.dtypes):
        used += _nbytes(shape, dtype)
        if used > address.bucket_bytes:
            count, used = count + 1, 0
    return count + (used > 0)


def check_against_served(address: TransferAddress, served: ServedWeights, version: int) -> None:
    """The update info must be the served checkpoint's synced set, each tensor's dtype and shape as stored."""
    synced = served.synced
    missing = [n for n in synced if n not in set(address.names)]
    extra = [n for n in address.names if n not in synced]
    if missing or extra or len(set(address.names)) != len(address.names):
        raise SyncError(f"weight sync v{version} through vLLM's engine: the update info names {len(address.names)} "
                        f"tensors; missing {missing[:5]}, not served {extra[:5]} (or a name twice)")
    for name, dtype, shape in zip(address.names, address.dtypes, address.shapes):
        spec = synced[name]
        if dtype != str(spec.dtype).removeprefix("torch.") or tuple(shape) != tuple(spec.shape):
            raise SyncError(f"weight sync v{version} through vLLM's engine: tensor {name} is {dtype} {list(shape)}, "
                            f"the checkpoint stores {spec.dtype} {list(spec.shape)}")


def checked_stream(named: Iterable[tuple[str, torch.Tensor]], address: TransferAddress, version: int
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """The trainer's tensors, each checked against the update info's next entry before it is packed."""
    index = 0
    for name, tensor in named:
        if index >= len(address.names):
            raise SyncError(f"weight sync v{version}: the trainer sent {name} after the {index} tensors announced")
        want = (address.names[index], address.dtypes[index], tuple(address.shapes[index]))
        got = (name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))
        if got != want:
            raise SyncError(f"weight sync v{version}: tensor {index} is {got}, the update info announced {want} "
                            "(the trainer's order must be the served checkpoint's)")
        index += 1
        yield name, tensor
    if index != len(address.names):
        raise SyncError(f"weight sync v{version}: the trainer sent {index} of the {len(address.names)} tensors "
                        "announced")


def apply_transfer(llm: Any, served: ServedWeights, address: TransferAddress, version: int,
                   joined: tuple[str, int] | None) -> tuple[str, int]:
    """The rollout's side of one sync on a ``vllm.LLM``: the update info checked against the served checkpoint
    before anything changes, the group joined if ``joined`` is not this address's, then vLLM's own
    start/update/finish while the trainer broadcasts. Returns the group now joined."""
    check_against_served(address, served, version)
    packed_at_init = packed_in_init_info()
    if joined != (address.host, address.port):
        llm.init_weight_transfer_engine({"init_info": worker_init_info(address, packed_at_init)})
    llm.start_weight_update()
    llm.update_weights({"update_info": update_info(address, packed_at_init)})
    llm.finish_weight_update()
    llm.collective_rpc("repro_repack_cpu_experts")  # vLLM re-packs CPU MoE experts only on a first load; 0 on GPUs
    return address.host, address.port


def open_nccl_endpoint(address: TransferAddress) -> Any:
    """The trainer's end of the group: vLLM's own rendezvous (a stateless group on the current device, rank 0)."""
    from vllm.distributed.weight_transfer.nccl_common import trainer_init

    return trainer_init({"master_address": address.host, "master_port": address.port,
                         "world_size": address.world})


class TransferSender:
    """Trainer rank 0's side: the group, formed once, and one packed broadcast per sync."""

    def __init__(self, address: TransferAddress, group: Any = None):
        self.address = address
        self.group = group if group is not None else open_nccl_endpoint(address)

    def send(self, named: Iterable[tuple[str, torch.Tensor]], version: int, device: torch.device | None = None
             ) -> int:
        """Broadcast every tensor, packed; returns the bytes sent. ``device``: where the buffers are packed (the
        current accelerator; a tensor elsewhere is copied there as it is packed)."""
        stream = checked_stream(named, self.address, version)
        to_device = _mover(device)
        try:  # 0.25.1: the trainer call the issue names
            from vllm.distributed.weight_transfer.nccl_engine import (
                NCCLTrainerSendWeightsArgs, NCCLWeightTransferEngine)
        except ImportError:  # 0.32: the broadcast its trainer engine makes when packed
            from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_producer

            packed_nccl_broadcast_producer(iterator=stream, group=self.group, src=0, post_iter_func=to_device,
                                           buffer_size_bytes=self.address.bucket_bytes,
                                           num_buffers=self.address.num_buffers)
        else:
            NCCLWeightTransferEngine.trainer_send_weights(stream, NCCLTrainerSendWeightsArgs(
                group=self.group, src=0, post_iter_func=to_device, packed=True,
                packed_buffer_size_bytes=self.address.bucket_bytes, packed_num_buffers=self.address.num_buffers))
        return self.address.nbytes


class TransferReceiver(Protocol):
    """The rollout side vLLM's wire drives (``repro.rollout.vllm_engine.VLLMEngine``)."""

    def receive_transfer(self, address: TransferAddress, version: int) -> SyncStats:
        """One sync through vLLM's weight-transfer engine, behind the engine's gate."""


class TransferWire:
    """vLLM's own wire (``repro.sync.handoff.Wire``): one sending rank, vLLM's NCCL group, its packed broadcast.
    The address carries the update info (the served checkpoint's synced tensors), so both sides cut the buffers
    alike."""

    def __init__(self, receivers: int, bucket_bytes: int, model_dir: str):
        self.receivers, self.bucket_bytes, self.model_dir = receivers, bucket_bytes, model_dir
        self.sender: TransferSender | None = None

    def address(self, sender: int, host: str) -> TransferAddress:
        if sender != 0:
            raise SyncError(f"vLLM's weight-transfer engine has one sender; sending rank {sender} asked to join")
        host, port = free_address(host)
        return transfer_address(host, port, self.receivers, self.bucket_bytes, served_from_folder(self.model_dir))

    def send(self, named: Iterable[tuple[str, torch.Tensor]], address: TransferAddress, version: int,
             sender: int) -> int:
        """The packed broadcast, after the device settles (vLLM packs on streams of its own that never wait on the
        default one; verl synchronises before broadcasting too); a failed send drops the group."""
        settle()
        try:
            if self.sender is None or self.sender.address != address:
                self.sender = TransferSender(address)
            return self.sender.send(named, version)
        except BaseException:
            self.sender = None
            raise

    def receive(self, engine: TransferReceiver, addresses: tuple[TransferAddress, ...], version: int) -> SyncStats:
        if len(addresses) != 1:
            raise SyncError(f"weight sync v{version} through vLLM's engine: {len(addresses)} senders, it takes one")
        return engine.receive_transfer(addresses[0], version)


def vllm_wire(recipe: "Recipe", model_dir: "str | Path") -> "TransferWire | BucketWire":
    """vLLM's wire where ``uses_vllm_transfer`` (one sender, GPUs, asked for), else repro's bucket stream, whose
    groups vLLM's workers join themselves."""
    from repro.recipes.backends import sync_receivers
    from repro.rollout.vllm_args import uses_vllm_transfer
    from repro.sync.bucket_wire import bucket_wire

    if uses_vllm_transfer(recipe):
        return TransferWire(sync_receivers(recipe), recipe.weight_sync.bucket_mb * 1024 * 1024, str(model_dir))
    return bucket_wire(recipe, model_dir)


def _mover(device: torch.device | None) -> Callable[[tuple[str, torch.Tensor]], torch.Tensor]:
    if device is None:
        device = current_accelerator() if torch.cuda.is_available() else None

    def to_device(item: tuple[str, torch.Tensor]) -> torch.Tensor:
        tensor = item[1]
        return tensor if device is None or tensor.device == device else tensor.to(device)

    return to_device
