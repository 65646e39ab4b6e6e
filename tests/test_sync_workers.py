"""The workers' two sides of a weight sync, as Ray runs them (sync group per sender, addresses only), driven
here from two threads: the rollout ends up serving exactly what the old whole-model update served."""

import threading

import torch

from repro.groups.workers import RolloutWorker, TrainerWorker
from repro.recipes import load_recipe
from repro.run.run_dir import check_inputs
from repro.sync.handoff import Senders


def test_trainer_and_rollout_workers_sync_over_their_group_bit_for_bit(tmp_path):
    recipe = load_recipe("tiny-cpu", ["weight_sync.bucket_mb=1", "weight_sync.timeout_s=120"])
    model_dir = check_inputs(recipe, tmp_path / "run", False)
    trainer, rollout = TrainerWorker(recipe, model_dir), RolloutWorker(recipe, model_dir)
    with torch.no_grad():  # a policy the rollout does not hold yet
        for p in trainer.trainer.model.parameters():
            if p.is_floating_point():
                p.mul_(1.25)
    address = trainer.sync_address()
    assert (address.sender, address.receivers, address.backend) == (0, 1, "gloo")
    sent = {}
    sender = threading.Thread(target=lambda: sent.setdefault("bytes", trainer.broadcast_weights(3, address)))
    sender.start()
    stats = rollout.receive_weights(Senders((address,)), version=3)
    sender.join(120)
    assert rollout.weight_version() == 3 and stats.buckets > 1 and sent["bytes"] >= stats.nbytes
    reference = RolloutWorker(recipe, model_dir).engine
    reference.update_weights(trainer.trainer.named_weights(), version=3)  # the old, whole-model path
    for (name, a), b in zip(reference.model.state_dict().items(), rollout.engine.model.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), name
    # the group stays up for the next sync; in one process the same buckets pass as an iterator
    thread = threading.Thread(target=lambda: trainer.broadcast_weights(4, address))
    thread.start()
    assert rollout.receive_weights(Senders((address,)), version=4).version == 4
    thread.join(120)
    assert rollout.receive_weights(trainer.send_weights(5), version=5).buckets == stats.buckets
