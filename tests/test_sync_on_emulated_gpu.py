"""The weight sync of a GPU trainer, on this CPU: where every tensor of repro's stream lives when the transport is
NCCL. STAND-IN: the GPU and NCCL are tests/standins/emulated_cuda.py's (device tensors are CPU data that report
another device; an op mixing them with host tensors raises CUDA's error, a collective given a host tensor raises
ProcessGroupNCCL's; gloo carries the bytes underneath). Not covered: NCCL itself, streams, device memory.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
import torch

from repro.sync.errors import SyncError
from repro.sync.group import SyncAddress, SyncGroup, free_address, receive_all
from repro.sync.bucket_wire import BucketWire
from repro.sync.stream import pack_buckets, verified_stream

sys.path.insert(0, str(Path(__file__).parent / "standins"))
from emulated_cuda import DeviceMode, emulated_cuda, is_on_device  # noqa: E402

WEIGHTS = [(f"layer.{i}.weight", torch.randn(64 + 3 * i, generator=torch.Generator().manual_seed(i)).bfloat16())
           for i in range(12)]


def _address(backend: str) -> SyncAddress:
    host, port = free_address("127.0.0.1")
    return SyncAddress(host, port, sender=0, receivers=1, backend=backend, timeout_s=30.0)


def _wire(address: SyncAddress) -> BucketWire:
    return BucketWire(bucket_bytes=512, receivers=1, backend=address.backend, timeout_s=address.timeout_s)


def test_a_gpu_trainers_weights_cross_an_nccl_group_on_the_device_and_arrive_bit_for_bit():
    """The trainer's tensors are on its GPU; the sender's group, headers and buckets are all device tensors, as
    ProcessGroupNCCL demands, and the receiver gets device buffers whose checksums and bytes match. Before the
    groups took their device from the transport, the sender built its NCCL group on the host and its first header
    was refused ("Tensors must be CUDA and dense")."""
    address, got, errors = _address("nccl"), [], []

    def receive():
        try:
            with DeviceMode():
                group = SyncGroup(address, 1)
                for _, named in verified_stream(receive_all([group], 7), 7, 1):
                    got.extend((name, is_on_device(t), t.cpu().clone()) for name, t in named)
        except Exception as err:  # raised below: here it would only hang the sender
            errors.append(err)

    with emulated_cuda():
        on_gpu = [(name, t.to("cuda")) for name, t in WEIGHTS]
        assert all(is_on_device(t) for _, t in on_gpu)
        receiver = threading.Thread(target=receive)
        receiver.start()
        sent = _wire(address).send(iter(on_gpu), address, version=7, sender=0)
        receiver.join(60)
    assert not errors, errors
    assert [name for name, _, _ in got] == [name for name, _ in WEIGHTS]
    assert all(device for _, device, _ in got)  # the buffers arrived on the receiver's GPU
    assert all(torch.equal(t.view(torch.int16), w.view(torch.int16)) for (_, _, t), (_, w) in zip(got, WEIGHTS))
    assert sent == sum(b.header.nbytes for b in pack_buckets(WEIGHTS, 512, version=7))  # payloads, alignment included


def test_buckets_are_built_on_the_transports_device_whatever_the_tensors_are_on():
    with emulated_cuda():
        to_gpu = list(pack_buckets(WEIGHTS, 512, version=1, device="cuda"))  # host tensors, NCCL transport
        oversize = list(pack_buckets(WEIGHTS[:1], 16, version=1, device="cuda"))  # one tensor alone, moved
        kept = list(pack_buckets([(n, t.to("cuda")) for n, t in WEIGHTS], 512, version=1))  # default: theirs
    assert all(is_on_device(b.payload) for b in to_gpu + kept if b.header.nbytes)
    assert is_on_device(oversize[0].payload) and oversize[0].header.nbytes == WEIGHTS[0][1].numel() * 2
    assert [b.header.checksum for b in to_gpu] == [b.header.checksum for b in pack_buckets(WEIGHTS, 512, version=1)]


def test_a_group_refuses_a_tensor_that_is_not_on_its_device_instead_of_moving_it():
    """As ProcessGroupNCCL refuses host tensors, every transport refuses what is not on its device (gloo would
    copy a device tensor silently); the error names the group and both devices."""
    address, done = _address("gloo"), threading.Event()
    receiver = threading.Thread(target=lambda: (SyncGroup(address, 1), done.wait(30)))
    receiver.start()
    try:
        group = SyncGroup(address, 0)
        assert group.device == torch.device("cpu")
        with pytest.raises(SyncError, match=r"sender 0 \(gloo\): the payload is on meta, the transport carries cpu"):
            group._broadcast(torch.empty(4, device="meta"), "the payload")
    finally:
        done.set()
        receiver.join(30)


def test_an_nccl_group_lives_on_the_current_gpu():
    address, members = _address("nccl"), {}
    with emulated_cuda():
        receiver = threading.Thread(target=lambda: members.setdefault(1, SyncGroup(address, 1)))
        receiver.start()
        members[0] = SyncGroup(address, 0)
        receiver.join(30)
    assert members[0].device == members[1].device == torch.device("meta")  # the emulated GPU


def test_the_device_is_settled_before_the_first_weight_is_read(monkeypatch):
    """vLLM's packed producer reads the weights on streams of its own and megatron's offloaded optimizer writes
    them back on another: the sender waits for the device before it pulls the first tensor."""
    import repro.sync.bucket_wire as bucket_wire

    events = []
    monkeypatch.setattr(bucket_wire, "settle", lambda: events.append("settle"))

    def weights():
        events.append("first weight read")
        yield from WEIGHTS

    address = _address("gloo")
    receiver = threading.Thread(target=lambda: list(receive_all([SyncGroup(address, 1)], 1)))
    receiver.start()
    _wire(address).send(weights(), address, version=1, sender=0)
    receiver.join(30)
    assert events == ["settle", "first weight read"]


def test_a_failed_send_drops_the_senders_group_so_the_next_sync_forms_a_new_one():
    address = _address("gloo")
    end = _wire(address)

    def broken():
        yield WEIGHTS[0]
        raise RuntimeError("the trainer failed half-way")

    receiver = threading.Thread(target=lambda: pytest.raises(Exception, list, receive_all([SyncGroup(address, 1)], 1)))
    receiver.start()
    with pytest.raises(RuntimeError, match="half-way"):
        end.send(broken(), address, version=1, sender=0)
    assert end.group is None
    receiver.join(60)
