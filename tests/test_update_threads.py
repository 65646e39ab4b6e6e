"""The embedded trainer's rows split over threads (repro.train.threads): the split rule, the same update as one
thread up to summation order, the same numbers on every run, errors from any thread, and the weights shared."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from repro.model.tiny import build_tiny_model
from repro.recipes.schema import OptimConfig
from repro.train.embedded import EmbeddedTrainer
from repro.train.grpo_update import TrainerSettings
from repro.train import threads
from repro.train.threads import ThreadedReplicas, balanced_shares, use_worker_threads, worker_thread_env
from test_trainer_contract import assert_same_gradients, make_batch, one_thread, with_old_logprobs  # noqa: F401

OPTIM = OptimConfig(lr=1e-3, weight_decay=0.0)


@pytest.fixture(scope="module")
def base_model():
    return build_tiny_model(seed=0)


def test_balanced_shares_split_by_running_width():
    rows = torch.tensor([10, 11, 12, 13, 14, 15])
    assert [s.tolist() for s in balanced_shares(rows, torch.ones(6, dtype=torch.int64), 2)] == \
        [[10, 11, 12], [13, 14, 15]]
    assert [s.tolist() for s in balanced_shares(rows, torch.tensor([5, 1, 1, 1, 1, 1]), 2)] == \
        [[10], [11, 12, 13, 14, 15]]
    assert [s.tolist() for s in balanced_shares(rows, torch.tensor([1, 1, 1, 1, 1, 7]), 2)] == \
        [[10, 11, 12, 13, 14, 15]]
    assert [s.tolist() for s in balanced_shares(rows[:2], torch.tensor([3, 3]), 3)] == [[10], [11]]
    assert balanced_shares(rows[:0], torch.zeros(0, dtype=torch.int64), 2) == []


def test_two_threads_give_one_threads_gradients_and_the_same_numbers_every_run(base_model):
    batch = make_batch(base_model)
    settings = TrainerSettings(dtype="fp32", max_tokens_per_micro_batch=16384, temperature=0.8, optim=OPTIM)
    trainers = {threads: EmbeddedTrainer(copy.deepcopy(base_model), settings, update_threads=threads)
                for threads in (1, 2)}
    batch = with_old_logprobs(trainers[1], batch)
    assert torch.equal(trainers[2].logprobs(batch).logprobs[batch.response_mask] != 0,
                       batch.old_logprobs[batch.response_mask] != 0)
    torch.testing.assert_close(trainers[2].logprobs(batch).logprobs, batch.old_logprobs, rtol=0, atol=1e-5)
    one, two = trainers[1].gradients(batch), trainers[2].gradients(batch)
    assert_same_gradients(one, two)
    again = trainers[2].gradients(batch)
    assert all(torch.equal(two[name], again[name]) for name in two)
    assert trainers[2].replicas.threads == 2 and not any(
        p.grad is not None for p in trainers[2].replicas.models[1].parameters())


def test_copies_share_the_weights_the_optimizer_updates(base_model):
    batch = make_batch(base_model)
    settings = TrainerSettings(dtype="fp32", max_tokens_per_micro_batch=16384, temperature=0.8, optim=OPTIM)
    trainer = EmbeddedTrainer(copy.deepcopy(base_model), settings, update_threads=2)
    trainer.train_step(with_old_logprobs(trainer, batch))
    model, replica = trainer.replicas.models
    changed = 0
    for (name, own), theirs, before in zip(model.named_parameters(), replica.parameters(), base_model.parameters()):
        assert theirs.data_ptr() == own.data_ptr(), name
        changed += not torch.equal(own, before)
    assert changed > 10  # the step moved the weights both copies read


def test_an_error_in_any_thread_is_raised_after_every_thread_has_finished():
    replicas = ThreadedReplicas(torch.nn.Linear(2, 2), 2)
    finished = threading.Event()

    def slow_then_done(model):
        finished.wait(0.2)
        finished.set()

    def fails(model):
        raise ValueError("row share 1 failed")

    with pytest.raises(ValueError, match="row share 1 failed"):
        replicas.run([[fails], [slow_then_done]])  # the calling thread fails first
    assert finished.is_set()
    with pytest.raises(ValueError, match="3 job lists for 2 threads"):
        replicas.run([[], [], []])


def test_worker_threads_are_capped_by_the_cores_this_process_may_use(monkeypatch):
    monkeypatch.setattr(threads, "usable_cores", lambda: 1)
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    assert worker_thread_env(4) == {"OMP_NUM_THREADS": "1", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"}
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "64")  # the user's cache size wins
    assert worker_thread_env(4)["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "64"
    monkeypatch.setattr(threads, "usable_cores", lambda: 3)
    assert worker_thread_env(4)["OMP_NUM_THREADS"] == "3"


def test_in_process_runs_take_the_workers_thread_settings(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the user's choice wins where it is set
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # (registered: the test leaves the environment as it was)
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "1024")
    try:
        assert use_worker_threads(2) == {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "ACTIVE",
                                         "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"}
        assert torch.get_num_threads() == 2
        use_worker_threads(1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
