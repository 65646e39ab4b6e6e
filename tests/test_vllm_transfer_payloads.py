"""repro.rollout.vllm_transfer's pure parts and the recipe -> weight_transfer_config mapping (no vLLM needed): the
update info both sides build from one address, in vLLM 0.25.1's and 0.32's layouts, the checks on each side, and
the count of buffers vLLM's packer fills. The transfer itself runs in tests/vllm/test_vllm_transfer.py."""

import pytest
import torch

from repro.model.served import ServedWeights, TensorSpec
from repro.recipes import load_recipe
from repro.recipes.backends import sync_senders
from repro.rollout.vllm_args import engine_args_from_recipe, uses_vllm_transfer
from repro.rollout.vllm_transfer import (
    TransferAddress, check_against_served, checked_stream, packed_buckets, transfer_address, update_info,
    worker_init_info,
)
from repro.sync.errors import SyncError

SERVED = ServedWeights("state_dict", {"a": TensorSpec((2, 3), torch.bfloat16), "b": TensorSpec((4,), torch.float32),
                                      "mtp.x": TensorSpec((1,), torch.bfloat16)}, "test", mtp=["mtp.x"])
PP1 = ["actor.pipeline_parallel=1", "actor.num_layers_in_first_pipeline_stage=null",
       "actor.num_layers_in_last_pipeline_stage=null"]


def test_vllm_engine_is_chosen_for_one_sender_on_gpus_only():
    amd = load_recipe("amd-dsv4-flash-mi308x")
    assert sync_senders(amd) == 4 and not uses_vllm_transfer(amd)  # PP4: one stream per stage, repro's groups
    assert "weight_transfer_config" not in engine_args_from_recipe(amd, "/m")
    one = load_recipe("amd-dsv4-flash-mi308x", PP1)
    assert sync_senders(one) == 1 and uses_vllm_transfer(one)
    assert engine_args_from_recipe(one, "/m")["weight_transfer_config"] == {"backend": "nccl"}
    off = load_recipe("amd-dsv4-flash-mi308x", PP1 + ["weight_sync.vllm_engine=false"])
    assert not uses_vllm_transfer(off) and "weight_transfer_config" not in engine_args_from_recipe(off, "/m")
    cpu = load_recipe("tiny-cpu", ["rollout.backend=vllm"])
    assert not uses_vllm_transfer(cpu) and "weight_transfer_config" not in engine_args_from_recipe(cpu, "/m")


def test_update_info_is_the_served_synced_set_in_both_vllm_layouts():
    address = transfer_address("10.0.0.1", 29600, 8, 1000, SERVED)
    assert (address.names, address.dtypes, address.shapes) == (("a", "b"), ("bfloat16", "float32"), ((2, 3), (4,)))
    assert address.world == 9 and address.nbytes == 12 + 16
    packing = {"packed": True, "packed_buffer_size_bytes": 1000, "packed_num_buffers": 2}
    base_init = {"master_address": "10.0.0.1", "master_port": 29600, "rank_offset": 1, "world_size": 9}
    base_update = {"names": ["a", "b"], "dtype_names": ["bfloat16", "float32"], "shapes": [[2, 3], [4]]}
    # 0.32: packing rides the handshake; 0.25.1: every update
    assert worker_init_info(address, True) == {**base_init, **packing}
    assert update_info(address, True) == base_update
    assert worker_init_info(address, False) == base_init
    assert update_info(address, False) == {**base_update, **packing}


def test_packed_buckets_follow_vllms_rule_a_buffer_closes_once_past_the_size():
    def address(sizes, bucket):
        return TransferAddress("h", 1, 1, bucket, tuple(f"t{i}" for i in range(len(sizes))),
                               ("uint8",) * len(sizes), tuple((s,) for s in sizes))
    assert packed_buckets(address([4, 4, 4], 8)) == 1   # 12 > 8 only after the third
    assert packed_buckets(address([4, 5, 4], 8)) == 2   # 9 > 8 closes the first, 4 left
    assert packed_buckets(address([20, 1], 8)) == 2     # an oversize tensor closes its own buffer
    assert packed_buckets(address([], 8)) == 0


def test_rollout_refuses_an_update_info_that_is_not_its_checkpoint():
    good = transfer_address("h", 1, 1, 64, SERVED)
    check_against_served(good, SERVED, 3)
    with pytest.raises(SyncError, match=r"v3 .*missing \['b'\]"):
        check_against_served(TransferAddress("h", 1, 1, 64, ("a",), ("bfloat16",), ((2, 3),)), SERVED, 3)
    with pytest.raises(SyncError, match=r"tensor b is float16 \[4\], the checkpoint stores torch.float32 \[4\]"):
        check_against_served(TransferAddress("h", 1, 1, 64, ("a", "b"), ("bfloat16", "float16"), ((2, 3), (4,))),
                             SERVED, 3)


def test_trainer_stream_is_checked_tensor_by_tensor_before_it_is_packed():
    address = transfer_address("h", 1, 1, 64, SERVED)
    a, b = torch.zeros(2, 3, dtype=torch.bfloat16), torch.zeros(4)
    assert [n for n, _ in checked_stream([("a", a), ("b", b)], address, 1)] == ["a", "b"]
    seen = []
    with pytest.raises(SyncError, match=r"tensor 0 is \('b', 'float32', \(4,\)\), the update info announced \('a'"):
        for name, _ in checked_stream([("b", b), ("a", a)], address, 1):
            seen.append(name)
    assert seen == []  # nothing of a wrong stream reaches the packer
    with pytest.raises(SyncError, match="sent 1 of the 2 tensors announced"):
        list(checked_stream([("a", a)], address, 1))
    with pytest.raises(SyncError, match="sent c after the 2 tensors announced"):
        list(checked_stream([("a", a), ("b", b), ("c", b)], address, 1))


def test_the_embedded_trainers_export_order_is_the_update_info_it_announces(tmp_path):
    """The trainer worker's side with vLLM's engine chosen: its address carries the served checkpoint's tensors
    (read from the model folder), and the trainer's own export stream passes the per-tensor check in that order."""
    from repro.groups.workers import RolloutWorker, TrainerWorker
    from repro.model.served import served_from_folder
    from repro.run.run_dir import check_inputs

    from repro.rollout.vllm_transfer import TransferWire
    from repro.sync.bucket_wire import BucketWire
    from repro.sync.handoff import Senders

    recipe = load_recipe("tiny-cpu")
    model_dir = check_inputs(recipe, tmp_path / "run", False)
    trainer = TrainerWorker(recipe, model_dir)
    assert isinstance(trainer.wire, BucketWire)  # the CPU recipe keeps repro's stream
    # what vllm_wire makes for a GPU recipe with one sender, on this trainer's model folder
    trainer.wire = TransferWire(1, recipe.weight_sync.bucket_mb << 20, str(model_dir))
    address = trainer.sync_address()
    served = served_from_folder(model_dir)
    assert isinstance(address, TransferAddress) and address.names == tuple(served.synced)
    assert address.bucket_bytes == recipe.weight_sync.bucket_mb << 20 and address.receivers == 1
    sent = list(checked_stream(trainer.trainer.sync_weights(), address, 1))
    assert [n for n, _ in sent] == list(address.names)
    assert sum(t.numel() * t.element_size() for _, t in sent) == address.nbytes

    class Recorder:  # the rollout worker's dispatch only: vLLM's wire hands its address to receive_transfer
        def receive_transfer(self, got, version):
            return got, version

    rollout = RolloutWorker.__new__(RolloutWorker)
    rollout.engine, rollout.wire = Recorder(), TransferWire(1, 1, str(model_dir))
    assert rollout.receive_weights(Senders((address,)), 4) == (address, 4)


def test_each_rollout_engine_brings_its_wire_and_the_trainer_makes_the_same_one():
    """The wire is the rollout engine's (repro.recipes.backends.ROLLOUTS[...].wire), made from the recipe alone, so
    a sending trainer rank makes the one the rollout receives by: vLLM's own engine for one sender on GPUs, repro's
    bucket stream otherwise (PP4's four senders, the CPU lane, any engine without a transfer of its own)."""
    from repro.groups.workers import wire_of
    from repro.rollout.vllm_transfer import TransferWire
    from repro.sync.bucket_wire import BucketWire

    one = wire_of(load_recipe("amd-dsv4-flash-mi308x", PP1), "/m")
    assert isinstance(one, TransferWire) and (one.receivers, one.bucket_bytes) == (8, 2048 * 1024 * 1024)
    pp4 = wire_of(load_recipe("amd-dsv4-flash-mi308x"), "/m")
    assert isinstance(pp4, BucketWire) and (pp4.receivers, pp4.backend) == (8, "nccl")
    embedded = wire_of(load_recipe("amd-dsv4-flash-mi308x", PP1 + ["rollout.backend=embedded"]), "/m")
    assert isinstance(embedded, BucketWire) and embedded.receivers == 1
    assert isinstance(wire_of(load_recipe("tiny-cpu", ["rollout.backend=vllm"]), "/m"), BucketWire)


def test_vllms_wire_settles_the_device_before_sending_and_drops_its_group_when_a_send_fails(monkeypatch):
    """TransferWire.send (defect 7 and 10 of the GPU read-through): the device is settled before vLLM's packer reads
    the first weight, and a send that fails forgets its group so the next sync forms a new one. STAND-IN: the NCCL
    sender (TransferSender: vLLM's packed broadcast) is replaced by a recorder, so no group forms and no stream race
    is shown; what runs is the wire's own order and its recovery."""
    import repro.rollout.vllm_transfer as vllm_transfer
    from repro.rollout.vllm_transfer import TransferWire

    events, made = [], []

    class Recorder:
        def __init__(self, address):
            self.address = address
            made.append(self)

        def send(self, named, version):
            events.append(f"send v{version}")
            if version == 2:
                raise RuntimeError("the broadcast failed half-way")
            return 28

    monkeypatch.setattr(vllm_transfer, "settle", lambda: events.append("settle"))
    monkeypatch.setattr(vllm_transfer, "TransferSender", Recorder)
    wire = TransferWire(receivers=8, bucket_bytes=1000, model_dir="/unused")
    address = transfer_address("10.0.0.1", 29600, 8, 1000, SERVED)
    assert wire.send([], address, version=1, sender=0) == 28
    first = wire.sender
    with pytest.raises(RuntimeError, match="half-way"):
        wire.send([], address, version=2, sender=0)
    assert wire.sender is None
    assert wire.send([], address, version=3, sender=0) == 28
    assert events == ["settle", "send v1", "settle", "send v2", "settle", "send v3"]
    assert len(made) == 2 and wire.sender is made[1] and made[0] is first  # v2 reused v1's group; v3 made its own
