"""Contract every trainer backend must meet, run here against the embedded CPU trainer.

Another backend runs the same tests from its own module: ``from test_trainer_contract import *`` and a
``trainer_factory`` fixture defined there (a callable ``(model, **settings) -> Trainer`` taking the keyword
settings used below), which takes precedence over this module's. Batches are fixed token sequences
scored by the tiny DeepSeek-V4 itself, with routing recorded from the model's own routers on the full batch
and rollout log-probs = the model's own perturbed by seeded noise (a stand-in for the FP8 mismatch), so TIS
weights take values on both sides of the cap.
"""

from __future__ import annotations

import copy
from dataclasses import replace
import math

import pytest
import torch

from repro.algos import logprobs_from_logits
from repro.recipes.schema import AlgorithmConfig, OptimConfig, RolloutCorrectionConfig
from repro.model.routing import RoutingRecorder, topk_routers
from repro.model.tiny import BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID, TINY_VOCAB_SIZE, build_tiny_model
from repro.rollout.types import FinishReason, Trajectory
from repro.train.base import TrainerError
from repro.train.batch import TrainBatch, build_batch
from repro.train.grpo_update import TrainerSettings
from repro.train.embedded import EmbeddedTrainer

TEMPERATURE = 0.8
# Two groups of four; group 1's zeros are a zero-variance GRPO group, skipped by the trainer.
ADVANTAGES = [1.2, -0.4, 0.7, -0.5, 0.0, 0.0, 0.0, 0.0]  # sum != 0, so a wrong row count shows in the loss


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # The model's ops are tiny: with other processes on the 2 cores, OpenMP's second thread spins and makes
    # each forward 10-20x slower than a single thread.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def base_model():
    return build_tiny_model(seed=0)


@pytest.fixture
def model(base_model):
    return copy.deepcopy(base_model)


@pytest.fixture
def trainer_factory():
    def make(model, **changes):
        """The contract's trainer, every setting stated; ``changes`` name ``TrainerSettings`` fields."""
        settings = TrainerSettings(
            dtype="fp32",
            max_tokens_per_micro_batch=4096,
            temperature=TEMPERATURE,
            optim=OptimConfig(lr=1e-3, weight_decay=0.0, betas=[0.9, 0.98]),
            algorithm=AlgorithmConfig(),
            rollout_correction=RolloutCorrectionConfig(mode="token", threshold=2.0),
        )
        return EmbeddedTrainer(model, replace(settings, **changes))

    return make


def make_batch(model, seed: int = 0, advantages=ADVANTAGES) -> TrainBatch:
    """Rows of BOS + 6 prompt tokens and 3..7 response tokens (EOS-terminated), right-padded."""
    gen = torch.Generator().manual_seed(seed)
    trajectories = []
    for row in range(len(advantages)):
        prompt = [BOS_TOKEN_ID] + torch.randint(3, TINY_VOCAB_SIZE, (6,), generator=gen).tolist()
        response = torch.randint(3, TINY_VOCAB_SIZE, (2 + row % 5,), generator=gen).tolist() + [EOS_TOKEN_ID]
        trajectories.append(Trajectory(row // 4, row % 4, prompt, response, torch.zeros(len(response)),
                                       FinishReason.EOS, weight_version=0))
    batch = build_batch(trajectories, torch.tensor(advantages), PAD_TOKEN_ID, with_routing=False)
    with torch.no_grad(), RoutingRecorder(model) as recorder:
        logits = model(input_ids=batch.input_ids, use_cache=False).logits
    batch.routing = recorder.indices()
    own = logprobs_from_logits(logits, batch.targets, TEMPERATURE)
    noise = 0.4 * torch.randn(own.shape, generator=gen)
    batch.rollout_logprobs = torch.where(batch.response_mask, own + noise, 0.0)
    return batch


def with_old_logprobs(trainer, batch: TrainBatch) -> TrainBatch:
    batch.old_logprobs = trainer.logprobs(batch).logprobs
    return batch


def gate_names(model) -> list[str]:
    return [f"model.layers.{layer}.mlp.gate.weight" for layer in topk_routers(model)]


def assert_same_gradients(reference: dict, other: dict) -> None:
    """Equal up to fp32 summation order (other shapes and row groupings round differently, ~1e-5 relative,
    more in tensors whose gradient is a sum that cancels); a wrong normaliser is off by a factor instead."""
    assert reference.keys() == other.keys()
    ref_all = torch.cat([g.flatten() for g in reference.values()])
    diff_all = torch.cat([(other[name] - g).flatten() for name, g in reference.items()])
    assert float(diff_all.norm()) <= 1e-5 * float(ref_all.norm())
    for name, ref in reference.items():
        bound = 1e-3 * float(ref.abs().max()) + 1e-6 * float(ref_all.abs().max())
        assert float((other[name] - ref).abs().max()) <= bound, name


def test_replaying_own_routing_is_bit_identical(model, trainer_factory):
    batch = make_batch(model)
    trainer = trainer_factory(model)
    replayed, free = trainer.logprobs(batch, replay_routing=True), trainer.logprobs(batch, replay_routing=False)
    assert replayed.logprobs.dtype == torch.float32 and replayed.logprobs.shape == batch.input_ids.shape
    assert torch.equal(replayed.logprobs, free.logprobs)
    assert torch.equal(replayed.entropy, free.entropy)
    assert (replayed.logprobs[~batch.response_mask] == 0).all()
    assert (replayed.logprobs[batch.response_mask] < 0).all()


def test_replaying_other_experts_changes_logprobs(model, trainer_factory):
    batch = make_batch(model)
    trainer = trainer_factory(model)
    own = trainer.logprobs(batch).logprobs
    num_experts = model.config.n_routed_experts
    batch.routing = {layer: (idx + 1) % num_experts for layer, idx in batch.routing.items()}
    other = trainer.logprobs(batch).logprobs
    assert float((other - own)[batch.response_mask].abs().max()) > 1e-3


def test_train_step_changes_parameters_and_router_gets_gradient(model, trainer_factory):
    batch = make_batch(model)
    trainer = trainer_factory(model, max_tokens_per_micro_batch=30)
    with_old_logprobs(trainer, batch)
    grads = trainer.gradients(batch)
    for name in gate_names(model):
        assert float(grads[name].abs().max()) > 0, f"{name} got no gradient through the replayed routing"
    before = dict(trainer.named_weights())
    metrics = trainer.train_step(batch)
    after = dict(trainer.named_weights())
    changed = [name for name, weight in after.items()
               if weight.is_floating_point() and not torch.equal(weight, before[name])]
    parameters = [name for name, _ in model.named_parameters()]
    # The Lightning Indexer only selects KV entries (a top-k, no gradient path; V4 trains it with its own loss).
    no_gradient = {name for name, grad in grads.items() if float(grad.abs().max()) == 0}
    assert all(".indexer." in name for name in no_gradient), sorted(no_gradient)
    assert set(gate_names(model)) | (set(parameters) - no_gradient) <= set(changed)
    expected_keys = {"actor/loss", "actor/grad_norm", "actor/entropy_nonzero_adv", "actor/pg_clipfrac",
                     "actor/pg_clipfrac_lower",
                     "actor/ppo_kl", "actor/lr", "actor/num_rows_skipped_zero_adv", "actor/micro_batches"}
    assert expected_keys <= metrics.keys()
    assert all(math.isfinite(v) for v in metrics.values())
    assert metrics["actor/num_rows_skipped_zero_adv"] == 4 and metrics["actor/lr"] == 1e-3
    assert metrics["actor/micro_batches"] >= 2
    assert metrics["actor/grad_norm"] > 0 and metrics["actor/entropy_nonzero_adv"] > 0
    assert "actor/entropy" not in metrics  # every row's entropy is the loop's, from pi_old (repro.run.steps)
    assert trainer.step == 1


def test_ppo_kl_is_a_mean_over_every_token_of_the_update(model, trainer_factory):
    """LumenRL's ppo_kl: sum(old - new) over every response token of the update / their count. With pi_old set
    0.1 below the current log-probs everywhere, each forwarded token adds -0.1; the four zero-advantage rows are
    not forwarded and add 0 (in a run their pi_old is these very weights' log-probs) but count in the mean."""
    batch = make_batch(model)
    trainer = trainer_factory(model)
    batch.old_logprobs = torch.where(batch.response_mask, trainer.logprobs(batch).logprobs - 0.1, 0.0)
    metrics = trainer.train_step(batch)
    tokens = batch.response_mask.sum(dim=1).double()
    forwarded = tokens[torch.tensor(ADVANTAGES) != 0].sum()
    assert metrics["actor/ppo_kl"] == pytest.approx(-0.1 * float(forwarded / tokens.sum()), rel=1e-5)


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean"])
@pytest.mark.parametrize("rho", [1.0, 3.0])
def test_loss_matches_hand_computation(model, trainer_factory, mode, rho):
    """old = current (ratio 1) and rollout = old - log(rho): weight min(rho, 2), loss = -weight x mean advantage."""
    batch = make_batch(model)
    trainer = trainer_factory(model, algorithm=AlgorithmConfig(loss_agg_mode=mode))
    with_old_logprobs(trainer, batch)
    batch.rollout_logprobs = torch.where(batch.response_mask, batch.old_logprobs - math.log(rho), 0.0)
    metrics = trainer.train_step(batch)
    adv, tokens = batch.advantages.double(), batch.response_mask.sum(dim=1).double()
    mean_adv = float(adv.mean()) if mode == "seq-mean-token-mean" else float((adv * tokens).sum() / tokens.sum())
    assert metrics["actor/loss"] == pytest.approx(-min(rho, 2.0) * mean_adv, rel=1e-5, abs=1e-7)
    assert metrics["actor/pg_clipfrac"] == 0 and metrics["actor/pg_clipfrac_lower"] == 0
    assert abs(metrics["actor/ppo_kl"]) < 1e-6


@pytest.mark.parametrize(
    "mode, budget, skip",
    [("seq-mean-token-mean", 30, False), ("seq-mean-token-mean", 4096, True), ("seq-mean-token-mean", 30, True),
     ("token-mean", 30, True), ("seq-mean-token-sum", 30, True)],
)
def test_micro_batching_and_zero_advantage_skipping_keep_the_gradient(model, trainer_factory, mode, budget, skip):
    """Reference: one micro-batch holding every row, zero-advantage rows included."""
    batch = make_batch(model)
    algorithm = AlgorithmConfig(loss_agg_mode=mode)
    whole = trainer_factory(model, algorithm=algorithm, skip_zero_advantage_rows=False)
    with_old_logprobs(whole, batch)
    variant = trainer_factory(model, algorithm=algorithm, max_tokens_per_micro_batch=budget,
                              skip_zero_advantage_rows=skip)
    assert_same_gradients(whole.gradients(batch), variant.gradients(batch))


def test_save_load_round_trip_gives_bit_identical_next_step(model, trainer_factory, tmp_path):
    first, second = make_batch(model, seed=1), make_batch(model, seed=2)
    saved = trainer_factory(model, optim=OptimConfig(lr=1e-3, warmup_steps=3, weight_decay=0.01))
    saved.train_step(with_old_logprobs(saved, first))
    saved.save(tmp_path / "state")
    expected = saved.train_step(with_old_logprobs(saved, copy.copy(second)))
    resumed = trainer_factory(build_tiny_model(seed=1), optim=OptimConfig(lr=1e-3, warmup_steps=3, weight_decay=0.01))
    resumed.load(tmp_path / "state")
    assert resumed.step == 1
    got = resumed.train_step(with_old_logprobs(resumed, copy.copy(second)))
    assert got == expected
    for (name, a), (name_b, b) in zip(saved.named_weights(), resumed.named_weights(), strict=True):
        assert name == name_b and torch.equal(a, b), name


def test_named_weights_carry_the_policy(model, trainer_factory):
    batch = make_batch(model)
    trainer = trainer_factory(model)
    trainer.train_step(with_old_logprobs(trainer, batch))
    weights = dict(trainer.named_weights())
    assert weights.keys() == model.state_dict().keys()  # parameters + persistent buffers (hash table, biases)
    assert all(w.device.type == "cpu" and not w.requires_grad for w in weights.values())
    fresh = build_tiny_model(seed=3)
    fresh.load_state_dict(weights, strict=True)
    assert torch.equal(trainer_factory(fresh).logprobs(batch).logprobs, trainer.logprobs(batch).logprobs)


def test_clear_errors(model, trainer_factory):
    trainer = trainer_factory(model)
    batch = make_batch(model)
    with pytest.raises(TrainerError, match="old_logprobs"):
        trainer.train_step(batch)
    with_old_logprobs(trainer, batch)
    no_routing = copy.copy(batch)
    no_routing.routing = None
    with pytest.raises(TrainerError, match="routing"):
        trainer.logprobs(no_routing)
    with pytest.raises(TrainerError, match="routing"):
        trainer.train_step(no_routing)
    trainer.logprobs(no_routing, replay_routing=False)  # no replay asked: no routing needed
    short = copy.copy(batch)
    short.routing = {layer: idx[:, :-1] for layer, idx in batch.routing.items()}
    with pytest.raises(TrainerError, match=r"routing\[\d\]"):
        trainer.train_step(short)
    bad_old = copy.copy(batch)
    bad_old.old_logprobs = batch.old_logprobs[:, :-1]
    with pytest.raises(TrainerError, match="old_logprobs"):
        trainer.train_step(bad_old)
