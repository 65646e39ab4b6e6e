"""What only the embedded trainer has: recipe wiring, the bf16 master-weight path, its state folder, warm-up."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
import torch

from repro.recipes.schema import AlgorithmConfig, OptimConfig, RolloutCorrectionConfig
from repro.model.tiny import build_tiny_model
from repro.recipes import load_recipe
from repro.train.base import TrainerError
from repro.train.embedded import EmbeddedTrainer
from repro.train.grpo_update import TrainerSettings, old_logprobs_from_update
from repro.train.optimizer import warmup_constant_lr
from test_trainer_contract import make_batch, one_thread, with_old_logprobs  # noqa: F401 (fixture)

OPTIM = OptimConfig(lr=1e-3, weight_decay=0.0)
SETTINGS = TrainerSettings(dtype="fp32", max_tokens_per_micro_batch=16384, temperature=0.8, optim=OPTIM)


@pytest.fixture(scope="module")
def base_model():
    return build_tiny_model(seed=0)


def test_state_folder_loads_as_a_checkpoint_through_from_recipe(base_model, tmp_path):
    trainer = EmbeddedTrainer(copy.deepcopy(base_model), SETTINGS)
    trainer.save(tmp_path / "state")
    recipe = load_recipe("tiny-cpu", ["actor.dtype=fp32"])  # the saved trainer is fp32; tiny-cpu's own is bf16
    loaded = EmbeddedTrainer.from_recipe(recipe, model_dir=tmp_path / "state")
    assert loaded.temperature == recipe.rollout.temperature
    assert loaded.optim.lr == recipe.optim.lr and loaded.max_tokens == recipe.actor.max_tokens_per_micro_batch
    assert loaded.replay_routing and loaded.dtype == torch.float32
    batch = make_batch(base_model)
    # Same weights (HF's loader lays some tensors out differently, so not bit-identical).
    torch.testing.assert_close(loaded.logprobs(batch).logprobs, trainer.logprobs(batch).logprobs, rtol=0, atol=1e-5)


def test_bf16_trains_on_fp32_masters_and_resumes_bit_identically(base_model, tmp_path):
    batch = make_batch(base_model)
    fp32 = EmbeddedTrainer(copy.deepcopy(base_model), SETTINGS)
    bf16 = EmbeddedTrainer(copy.deepcopy(base_model), replace(SETTINGS, dtype="bf16"))
    gap = (bf16.logprobs(batch).logprobs - fp32.logprobs(batch).logprobs).abs().max()
    assert 0 < float(gap) < 0.05
    bf16.train_step(with_old_logprobs(bf16, batch))
    weights = dict(bf16.named_weights())
    # The export keeps the served checkpoint's dtypes (this in-memory model was built in fp32) while the trainer
    # computes in bf16, except for what the release stores in FP32, which trains in FP32 too.
    assert weights["lm_head.weight"].dtype == torch.float32 and bf16.model.lm_head.weight.dtype == torch.bfloat16
    assert weights["model.layers.0.mlp.gate.tid2eid"].dtype == torch.int64  # integer buffers keep their dtype
    assert bf16.model.model.layers[0].attn_hc.fn.dtype == torch.float32
    bf16.save(tmp_path / "state")
    assert (tmp_path / "state" / "master.safetensors").is_file()
    expected = bf16.train_step(batch)
    resumed = EmbeddedTrainer(build_tiny_model(seed=4), replace(SETTINGS, dtype="bf16"))
    resumed.load(tmp_path / "state")
    assert resumed.train_step(batch) == expected


def test_load_refuses_a_mismatched_or_incomplete_state(base_model, tmp_path):
    EmbeddedTrainer(copy.deepcopy(base_model), replace(SETTINGS, dtype="bf16")).save(tmp_path / "state")
    with pytest.raises(TrainerError, match="bf16"):
        EmbeddedTrainer(copy.deepcopy(base_model), SETTINGS).load(tmp_path / "state")
    (tmp_path / "state" / "optimizer.safetensors").unlink()
    with pytest.raises(TrainerError, match="optimizer.safetensors"):
        EmbeddedTrainer(copy.deepcopy(base_model), replace(SETTINGS, dtype="bf16")).load(tmp_path / "state")
    meta = json.loads((tmp_path / "state" / "trainer_state.json").read_text())
    assert meta["step"] == 0 and meta["dtype"] == "bf16"


def test_updates_per_step_splits_the_batch_into_updates(base_model):
    batch = make_batch(base_model)
    trainer = EmbeddedTrainer(copy.deepcopy(base_model),
                              replace(SETTINGS, algorithm=AlgorithmConfig(updates_per_step=2)))
    metrics = trainer.train_step(with_old_logprobs(trainer, batch))
    assert trainer.step == 1 and trainer.updates == 2
    assert metrics["actor/num_rows_skipped_zero_adv"] == 4  # rows 4-7, all in the second update
    with pytest.raises(TrainerError, match="updates_per_step"):
        too_many = replace(SETTINGS, algorithm=AlgorithmConfig(updates_per_step=9))
        EmbeddedTrainer(copy.deepcopy(base_model), too_many).train_step(batch)


def test_unsupported_settings_are_refused(base_model):
    with pytest.raises(TrainerError, match="kl_coef"):
        EmbeddedTrainer(copy.deepcopy(base_model), replace(SETTINGS, algorithm=AlgorithmConfig(kl_coef=0.1)))
    with pytest.raises(TrainerError, match="dtype"):
        replace(SETTINGS, dtype="fp16")


def test_warmup_ramps_linearly_then_holds():
    optim = OptimConfig(lr=1e-4, warmup_steps=4)
    assert [warmup_constant_lr(optim, k) for k in range(6)] == pytest.approx([2.5e-5, 5e-5, 7.5e-5, 1e-4, 1e-4, 1e-4])
    assert warmup_constant_lr(OptimConfig(lr=1e-4), 0) == 1e-4


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("max_tokens", [16384, 40])  # one micro-batch, and several of differing widths
def test_old_logprobs_from_the_update_equal_a_separate_rescoring(base_model, max_tokens, threads):
    """One update per step: pi_old from the update's own forward (and a no-grad pass over the zero-advantage rows
    it skips) is the separate rescoring's numbers exactly, and so are the update's metrics and new weights."""
    batch = make_batch(base_model)
    assert (batch.advantages == 0).any() and (batch.advantages != 0).any()
    settings = replace(SETTINGS, max_tokens_per_micro_batch=max_tokens)
    separate, fused = (EmbeddedTrainer(copy.deepcopy(base_model), settings, update_threads=threads) for _ in range(2))
    for _ in range(2):  # the second step starts from the updated weights
        rescored = separate.logprobs(batch)
        expected = separate.train_step(replace(batch, old_logprobs=rescored.logprobs))
        scores, metrics = fused.scored_train_step(batch)
        assert torch.equal(scores.logprobs, rescored.logprobs) and torch.equal(scores.entropy, rescored.entropy)
        assert metrics == expected and metrics["actor/num_rows_skipped_zero_adv"] > 0
    for (name, a), (_, b) in zip(separate.named_weights(), fused.named_weights()):
        assert torch.equal(a, b), name


def test_old_logprobs_from_the_update_are_refused_where_they_would_be_stale(base_model):
    batch = make_batch(base_model)
    two_updates = EmbeddedTrainer(copy.deepcopy(base_model),
                                  replace(SETTINGS, algorithm=AlgorithmConfig(updates_per_step=2)))
    with pytest.raises(TrainerError, match="updates_per_step=2"):
        two_updates.scored_train_step(batch)
    rejecting = EmbeddedTrainer(copy.deepcopy(base_model),
                                replace(SETTINGS, rollout_correction=RolloutCorrectionConfig(mode="token_mask")))
    with pytest.raises(TrainerError, match="token_mask"):
        rejecting.scored_train_step(batch)
    recipe = load_recipe("tiny-cpu")
    assert old_logprobs_from_update(recipe)
    assert not old_logprobs_from_update(load_recipe("tiny-cpu", ["actor.old_logprobs_from_update=false"]))
    assert not old_logprobs_from_update(load_recipe("tiny-cpu", ["algorithm.updates_per_step=2"]))


def test_weight_decay_rule_spares_biases_and_1d_parameters():
    """megatron-core's rule (AMD's run, through LumenRL's OptimizerParamScheduler): no decay for a name ending in
    '.bias' or a 1-D parameter. With zero gradients AdamW's step is the decay alone: p <- p (1 - lr wd)."""
    from repro.train.optimizer import MasterAdamW, adamw_groups

    model = torch.nn.Module()
    model.proj = torch.nn.Linear(3, 2)           # weight [2, 3] decays, bias [2] does not
    model.norm = torch.nn.LayerNorm(3)           # weight and bias [3]: 1-D, no decay
    model.scale = torch.nn.Parameter(torch.ones(4))  # 1-D, no decay
    model.table = torch.nn.Parameter(torch.ones(2, 2, 2))  # 3-D, decays
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    lr, wd = 0.5, 0.1
    for rule, decayed in (("megatron", {"proj.weight", "table"}), ("all", set(before))):
        for name, p in model.named_parameters():
            p.data.copy_(before[name])
        opt = MasterAdamW(model, OptimConfig(lr=lr, weight_decay=wd, weight_decay_rule=rule))
        opt.zero_grad()
        assert opt.step(lr) == 0.0
        for name, p in model.named_parameters():
            factor = 1 - lr * wd if name in decayed else 1.0
            torch.testing.assert_close(p.detach(), before[name] * factor, rtol=0, atol=1e-7, msg=f"{rule}: {name}")
    names = [n for n, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    megatron = adamw_groups(names, params, OptimConfig(weight_decay=wd))
    # groups in first-use order: the module's own parameters (scale, table) come before its children's
    assert [(g["weight_decay"], len(g["params"])) for g in megatron] == [(0.0, 4), (wd, 2)]
    # no decay at all: one group, the layout AdamW with a single weight_decay builds (checkpoints stay compatible)
    assert len(adamw_groups(names, params, OptimConfig(weight_decay=0.0))) == 1
