"""MegatronTrainer beyond the shared contract: BF16 export for the weight sync, the recipe path, named errors."""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed here: "
                                            "`make test-megatron` runs this lane in .venv-megatron")

import torch  # noqa: E402

from repro.recipes.schema import OptimConfig  # noqa: E402
from repro.recipes import load_recipe  # noqa: E402
from repro.train.base import TrainerError  # noqa: E402
from repro.train.megatron.model import record_routing  # noqa: E402
from repro.train.megatron.trainer import MegatronTrainer  # noqa: E402
from repro.train.grpo_update import TrainerSettings  # noqa: E402
from repro.train.megatron.tiny import build_tiny_gpt_moe  # noqa: E402
from test_megatron_contract import MODEL_SEED, make_megatron_batch, one_thread  # noqa: E402,F401


def test_bf16_trainer_exports_bf16_weights_and_keeps_fp32_masters(tmp_path):
    model = build_tiny_gpt_moe(seed=MODEL_SEED)
    batch = make_megatron_batch(model)
    trainer = MegatronTrainer(model, TrainerSettings(dtype="bf16", max_tokens_per_micro_batch=16384, temperature=0.8,
                                                     optim=OptimConfig(lr=1e-3, weight_decay=0.0)))
    batch.old_logprobs = trainer.logprobs(batch).logprobs
    metrics = trainer.train_step(batch)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    weights = dict(trainer.named_weights())
    assert weights and all(w.dtype == torch.bfloat16 for w in weights.values())
    assert all(m.dtype == torch.float32 for m in trainer.opt.inner.master_state().values())
    saved = trainer.save(tmp_path / "state")
    from megatron.core.dist_checkpointing import load_tensors_metadata

    from repro.train.megatron.optimizers import _sharded_params

    # the fp32 masters are in the dist checkpoint beside the bf16 weights, sharded as their parameters (megatron's
    # keys: layers and experts stacked into one global tensor each)
    saved_tensors = load_tensors_metadata(str(saved / "dist"))
    sharded = _sharded_params(trainer.model, trainer.model.sharded_state_dict())
    assert len({t.key for t in sharded.values()}) < len(sharded)  # stacked: fewer global tensors than parameters
    for name, param in sharded.items():
        master = saved_tensors[f"optimizer.master.{param.key}"]
        assert master.dtype == torch.float32 and master.global_shape == saved_tensors[param.key].global_shape, name
        assert saved_tensors[param.key].dtype == torch.bfloat16


def test_export_names_maps_the_synced_weights():
    model = build_tiny_gpt_moe(seed=MODEL_SEED)
    trainer = MegatronTrainer(model, TrainerSettings(dtype="fp32", max_tokens_per_micro_batch=16384, temperature=1.0),
                              export_names=lambda w: {f"policy.{k}": v for k, v in w.items()})
    from repro.train.megatron.model import weight_state

    assert {name for name, _ in trainer.named_weights()} == {f"policy.{k}" for k in weight_state(model)}


def test_from_recipe_builds_the_cpu_trainer_and_records_sequence_first_routing():
    recipe = load_recipe("tiny-cpu", ["actor.dtype=fp32"])  # the CPU lane trains Megatron in fp32
    trainer = MegatronTrainer.from_recipe(recipe, model_provider=lambda recipe: build_tiny_gpt_moe(seed=MODEL_SEED))
    batch = make_megatron_batch(trainer.model)
    logits, routing = record_routing(trainer.model, batch.input_ids)
    assert logits.shape == (*batch.input_ids.shape, 25)
    for layer, idx in routing.items():
        assert idx.shape == (*batch.input_ids.shape, 2) and 0 <= int(idx.min()) and int(idx.max()) < 8
        # row 0 alone routes exactly as inside the batch: [B, T, k] <-> megatron's [T * B, k] is not mixed up
    _, alone = record_routing(trainer.model, batch.input_ids[:1])
    assert all(torch.equal(alone[layer][0], routing[layer][0]) for layer in routing)
    assert trainer.logprobs(batch).logprobs.shape == batch.input_ids.shape


def test_amd_layout_on_one_process_fails_naming_the_parallel_sizes():
    with pytest.raises(TrainerError, match="tensor_model_parallel_size|tensor_parallel"):
        MegatronTrainer.from_recipe(load_recipe("amd-dsv4-flash-mi308x"))


def test_state_from_another_backend_is_refused(tmp_path):
    model = build_tiny_gpt_moe(seed=MODEL_SEED)
    trainer = MegatronTrainer(model, TrainerSettings(dtype="fp32", max_tokens_per_micro_batch=16384, temperature=1.0))
    folder = trainer.save(tmp_path / "state")
    meta = (folder / "trainer_state.json").read_text().replace('"megatron"', '"embedded"')
    (folder / "trainer_state.json").write_text(meta)
    with pytest.raises(TrainerError, match="trainer_state.json.*megatron"):
        trainer.load(folder)


def test_full_recompute_replays_the_same_experts_in_backward():
    """AMD recomputes every layer in backward: the recomputed forward must route the replayed experts again, or
    its activations would not match the saved ones. Replaying experts the model would NOT pick makes that show."""
    from test_trainer_contract import assert_same_gradients, with_old_logprobs

    reference = build_tiny_gpt_moe(seed=MODEL_SEED)
    batch = make_megatron_batch(reference)
    batch.routing = {layer: (idx + 1) % 8 for layer, idx in batch.routing.items()}
    plain = MegatronTrainer(reference, TrainerSettings(dtype="fp32", max_tokens_per_micro_batch=16384, temperature=0.8))
    with_old_logprobs(plain, batch)
    expected = plain.gradients(batch)
    recomputed = build_tiny_gpt_moe(seed=MODEL_SEED, recompute_granularity="full", recompute_method="uniform",
                                    recompute_num_layers=1)
    trainer = MegatronTrainer(recomputed,
                              TrainerSettings(dtype="fp32", max_tokens_per_micro_batch=16384, temperature=0.8))
    calls = []
    hooks = [r.module.register_forward_hook(lambda *args: calls.append(1)) for r in trainer.routers.values()]
    got = trainer.gradients(batch)
    for hook in hooks:
        hook.remove()
    assert len(calls) == 2 * len(trainer.routers)  # one micro-batch: forward + recomputed forward per MoE layer
    assert_same_gradients(expected, got)
