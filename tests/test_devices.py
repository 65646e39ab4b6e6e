"""repro.devices (which GPU a trainer rank takes, where collectives' tensors live) and the injected NaN-gradient
fault (repro.train.faults) on the embedded trainer. What Ray really shows an actor is in test_cluster_placement.py
(a simulated cluster with Ray's own GPU isolation); placement on a device in test_sync_on_emulated_gpu.py."""

from __future__ import annotations

import pytest
import torch

from repro.devices import DeviceError, collective_device, local_device_index
from repro.train.faults import NAN_GRADIENT_ENV


def test_under_rays_isolation_a_rank_takes_the_one_gpu_it_sees_whatever_its_local_rank():
    # rank 1 of a node: Ray gave it GPU 1 and hides the rest, so torch sees one device, index 0
    env = {"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "1"}
    assert local_device_index(env, ["1"], device_count=1) == 0
    assert local_device_index({"LOCAL_RANK": "5", "HIP_VISIBLE_DEVICES": "3,5"}, ["5"], device_count=2) == 1
    # RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES: nothing hidden, Ray's id is the index
    assert local_device_index({"LOCAL_RANK": "0"}, ["6"], device_count=8) == 6
    # torchrun: no Ray assignment, LOCAL_RANK it is
    assert local_device_index({"LOCAL_RANK": "3"}, [], device_count=8) == 3


def test_an_index_that_is_not_a_visible_gpu_is_refused_naming_the_variables():
    # the rule before: LOCAL_RANK as the index under Ray's isolation -> "invalid device ordinal" on 14 of 16 ranks
    with pytest.raises(DeviceError, match=r"LOCAL_RANK=1 picks GPU index 1, but this process sees 1 GPU\(s\) "
                                          r"\(CUDA_VISIBLE_DEVICES=1\)"):
        local_device_index({"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "1"}, [], device_count=1)
    with pytest.raises(DeviceError, match="Ray gave this rank GPU 2, but the process sees only 0,1"):
        local_device_index({"CUDA_VISIBLE_DEVICES": "0,1"}, ["2"], device_count=2)
    with pytest.raises(DeviceError, match="given 2 GPUs by Ray"):
        local_device_index({}, ["0", "1"], device_count=2)


def test_nccl_collectives_take_the_current_gpu_and_gloo_the_host(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "meta")  # a stand-in device index this CPU has
    assert collective_device("nccl") == torch.device("meta")
    assert collective_device("gloo") == torch.device("cpu")


def test_an_injected_nan_gradient_skips_that_update_and_the_next_one_steps(monkeypatch):
    from repro.model.tiny import build_tiny_model
    from repro.recipes.schema import OptimConfig
    from repro.train.embedded import EmbeddedTrainer
    from repro.train.grpo_update import TrainerSettings
    from test_trainer_contract import make_batch

    trainer = EmbeddedTrainer(build_tiny_model(seed=0), TrainerSettings(dtype="fp32", max_tokens_per_micro_batch=16384,
                                                                        temperature=1.0, optim=OptimConfig(lr=1e-3)))
    batch = make_batch(trainer.model)
    batch.old_logprobs = trainer.logprobs(batch).logprobs
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    monkeypatch.setenv(NAN_GRADIENT_ENV, "1")
    skipped = trainer.train_step(batch)
    assert skipped["actor/grad_norm"] != skipped["actor/grad_norm"]
    assert all(torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    stepped = trainer.train_step(batch)  # update 2: untouched by the fault
    assert stepped["actor/grad_norm"] > 0 and trainer.updates == 2
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


@pytest.mark.parametrize("value", ["two", "0"])
def test_a_fault_setting_that_is_not_an_update_number_is_refused(monkeypatch, value):
    from repro.train.base import TrainerError
    from repro.train.faults import nan_gradient_update

    monkeypatch.setenv(NAN_GRADIENT_ENV, value)
    with pytest.raises(TrainerError, match=NAN_GRADIENT_ENV):
        nan_gradient_update()


def test_a_lone_gpu_trainer_rank_joins_a_one_rank_nccl_world_on_its_gpu(monkeypatch):
    """megatron's model-parallel groups need a process group even for one rank; Ray starts a lone rank with no
    rendezvous variables, and before, on a GPU, nothing made one ("torch.distributed is not initialised"). STAND-IN:
    torch's CUDA and process-group calls are recorded, not made (no GPU here); the CPU lane's lone rank is the
    shim's."""
    import torch.distributed as dist

    from repro.train.megatron import parallel

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: calls.append(("set_device", index)))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.append(
        (backend, kw["rank"], kw["world_size"], type(kw["store"]).__name__)))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # Ray gave the actor GPU 3 and hides the rest
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    parallel.join_world(1)
    assert calls == [("set_device", 0), ("nccl", 0, 1, "HashStore")]
