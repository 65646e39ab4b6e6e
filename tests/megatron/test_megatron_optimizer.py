"""The Megatron trainer's optimizer choice (repro.train.megatron.optimizers): megatron's own on a GPU, the project's
AdamW on CPU. megatron-core 0.16.1's optimizers cannot be built without CUDA (checked below), so the GPU path runs
here against a STAND-IN for the object ``get_megatron_optimizer`` returns: only its device step is replaced (fp32
AdamW, clip by the global norm). Everything around it is megatron's real code on CPU: ``OptimizerConfig`` from the
recipe, ``DistributedDataParallel`` and its fp32 gradient buffers fed by its own backward hooks through megatron's
schedule, ``finalize_model_grads``, and the dist checkpoint that calls the optimizer's ``sharded_state_dict``."""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed here: "
                                            "`make test-megatron` runs this lane in .venv-megatron")

import torch  # noqa: E402

import repro.train.megatron.optimizers as optimizers  # noqa: E402
import repro.train.megatron.trainer as trainer_module  # noqa: E402
from repro.recipes import load_recipe  # noqa: E402
from repro.train.base import TrainerError  # noqa: E402
from repro.train.megatron.config import megatron_layout  # noqa: E402
from repro.train.megatron.trainer import MegatronTrainer  # noqa: E402
from repro.train.optimizer import decays  # noqa: E402
from test_megatron_contract import make_megatron_batch, one_thread  # noqa: E402,F401

SETS = ["actor.dtype=fp32", "actor.backend=megatron", "actor.model_provider=repro.train.megatron.tiny:provider",
        "actor.num_workers=1", "actor.max_tokens_per_micro_batch=40", "optim.lr=0.001", "optim.grad_clip=0.05",
        "optim.warmup_steps=2", "optim.weight_decay=0.1", "seed=3"]


class StandInMegatronOptimizer:
    """STAND-IN for megatron's optimizer on a GPU (a ChainedOptimizer of FP32Optimizer / DistributedOptimizer over
    HybridDeviceOptimizer), as megatron-core 0.16.1 behaves (optimizer/optimizer.py): the fp32 masters' gradients are
    filled only inside ``step()`` -> ``prepare_grads()`` (copied from DDP's ``main_grad`` buffers), so
    ``get_grad_norm()`` reads the masters and is 0 before; ``step()`` clips by the global norm only when the clip
    factor is below 1 (a NaN norm clips nothing) and steps whatever the gradient holds (no grad scaler for BF16),
    returning ``(ok, norm, zeros)``. Its param groups are megatron's own (``_get_param_groups``: biases and 1-D
    parameters in groups of ``wd_mult`` 0), each starting at the config's weight decay, as megatron's Adam is built;
    only a scheduler changes a group's decay. Only the device step is replaced (torch's AdamW on the fp32 masters,
    copied back). It records what our side hands it."""

    def __init__(self, config, model_chunks):
        from megatron.core.optimizer import _get_param_groups

        self.config, self.chunks = config, model_chunks
        self.params = list(model_chunks[0].module.parameters())
        self.masters = [torch.nn.Parameter(p.detach().float().clone()) for p in self.params]
        master_of = {id(p): m for p, m in zip(self.params, self.masters)}
        groups = [{**group, "params": [master_of[id(p)] for p in group["params"]]}
                  for group in _get_param_groups(model_chunks, config, None)]
        self.inner = torch.optim.AdamW(groups, lr=config.lr, betas=(config.adam_beta1, config.adam_beta2),
                                       eps=config.adam_eps, weight_decay=config.weight_decay)
        self.param_groups = self.inner.param_groups
        self.lrs, self.state_calls, self.loaded = [], [], []

    def zero_grad(self):
        for m in self.masters:
            m.grad = None

    def prepare_grads(self) -> bool:
        for master, p in zip(self.masters, self.params):
            master.grad = p.main_grad.float().clone()
        return False  # found_inf: only a grad scaler (fp16) ever reports one

    def get_grad_norm(self) -> float:
        grads = [m.grad for m in self.masters if m.grad is not None]
        return float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0

    def step(self):
        if self.prepare_grads():
            return False, None, None
        norm = self.get_grad_norm()
        coefficient = self.config.clip_grad / (norm + 1.0e-6)
        if coefficient < 1.0:  # megatron's clip_grad_by_total_norm_fp32
            for m in self.masters:
                m.grad.mul_(coefficient)
        self.lrs.append(self.param_groups[0]["lr"])
        self.inner.step()
        with torch.no_grad():
            for master, p in zip(self.masters, self.params):
                p.copy_(master)
        return True, norm, 0

    def sharded_state_dict(self, model_sharded_state_dict, is_loading=False, metadata=None):
        self.state_calls.append((is_loading, metadata))
        return {}

    def load_state_dict(self, state):
        self.loaded.append(state)


@pytest.fixture
def stand_in(monkeypatch):
    built = []

    def get_megatron_optimizer(config, model_chunks):
        built.append(StandInMegatronOptimizer(config, model_chunks))
        return built[-1]

    import megatron.core.optimizer as megatron_optimizer

    monkeypatch.setattr(megatron_optimizer, "get_megatron_optimizer", get_megatron_optimizer)
    monkeypatch.setattr(trainer_module, "trainer_optimizer",
                        functools.partial(optimizers.trainer_optimizer, on_gpu=True))
    return built


def test_megatron_optimizers_cannot_be_built_on_cpu():
    """Why the GPU path has a stand-in here: the real get_megatron_optimizer fails on a CPU-only torch."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    trainer = MegatronTrainer.from_recipe(load_recipe("tiny-cpu", SETS))
    assert isinstance(trainer.opt, optimizers.ProjectAdamW)  # no GPU here: the project's AdamW
    ddp = DistributedDataParallel(trainer.model.config, DistributedDataParallelConfig(grad_reduce_in_fp32=True),
                                  trainer.model)
    with pytest.raises(AssertionError, match="CUDA"):
        get_megatron_optimizer(OptimizerConfig(lr=1e-3), [ddp])


def test_gpu_path_takes_the_recipe_config_and_steps_as_the_project_adamw(stand_in, tmp_path):
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.optimizer import OptimizerConfig

    recipe = load_recipe("tiny-cpu", SETS)
    gpu = MegatronTrainer.from_recipe(recipe)
    (optimizer,) = stand_in
    assert isinstance(gpu.opt, optimizers.MegatronAdamW) and gpu.opt.optimizer is optimizer
    # megatron's real config and DDP wrapper, built from the recipe's mapping
    assert isinstance(optimizer.config, OptimizerConfig)
    for field, value in megatron_layout(recipe)["optimizer"].items():
        assert getattr(optimizer.config, field) == value, field
    (ddp,) = optimizer.chunks
    assert isinstance(ddp, DistributedDataParallel) and ddp.module is gpu.model and ddp.ddp_config.grad_reduce_in_fp32

    with pytest.MonkeyPatch.context() as patch:  # the same recipe and seed on the CPU lane's optimizer
        patch.setattr(trainer_module, "trainer_optimizer",
                      functools.partial(optimizers.trainer_optimizer, on_gpu=False))
        cpu = MegatronTrainer.from_recipe(recipe)
    assert isinstance(cpu.opt, optimizers.ProjectAdamW)
    batch = make_megatron_batch(cpu.model, seed=5)
    batch.old_logprobs = cpu.logprobs(batch).logprobs
    # the gradient in DDP's fp32 buffer (its hooks, megatron's schedule) is the one autograd leaves in .grad
    got_grads, want_grads = gpu.gradients(batch), cpu.gradients(batch)
    assert all(torch.equal(got_grads[name], want_grads[name]) for name in want_grads)
    gaps = []
    for _ in range(3):
        got, want = gpu.train_step(batch), cpu.train_step(batch)
        assert got["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-6)
        assert got["actor/loss"] == pytest.approx(want["actor/loss"], rel=1e-6, abs=1e-9)
        gaps.append(max(float((a - b).abs().max()) for a, b in zip(gpu.model.parameters(), cpu.model.parameters())))
    # not bit for bit: the stand-in's norm (torch's get_total_norm) and the trainer's (summed per TP/EP group) round
    # differently, so the clip factors differ in the last bit; Adam's 1/sqrt(v) amplifies that where v is tiny
    assert max(gaps) <= 1e-6, gaps
    assert optimizer.lrs == pytest.approx([5e-4, 1e-3, 1e-3])  # our warm-up set on megatron's param groups
    # megatron's rule, as its OptimizerParamScheduler applies it (AMD's run): no decay for biases and 1-D parameters
    group_decays = {(g["wd_mult"], g["weight_decay"]) for g in optimizer.param_groups if g["params"]}
    assert group_decays == {(0.0, 0.0), (1.0, 0.1)}
    one_d = {id(m) for group in optimizer.param_groups if group["wd_mult"] == 0.0 for m in group["params"]}
    assert one_d == {id(m) for m in optimizer.masters if m.dim() == 1} and one_d
    # the CPU lane's AdamW spares exactly the parameters megatron's own grouping does (repro.train.optimizer.decays)
    spared_by_megatron = {name for (name, _), m in zip(gpu.model.named_parameters(), optimizer.masters)
                          if id(m) in one_d}
    spared_on_cpu = {name for name, p in cpu.model.named_parameters() if not decays(name, p, "megatron")}
    assert spared_on_cpu == spared_by_megatron
    print(f"\nstand-in megatron optimizer vs project AdamW, max |dw| per step: {gaps}")

    gpu.save(tmp_path / "state")  # the dist checkpoint asks megatron's optimizer for its sharded state
    gpu.load(tmp_path / "state")
    assert optimizer.state_calls == [(False, optimizers.DISTRIB_OPTIM_SHARDING),
                                     (True, optimizers.DISTRIB_OPTIM_SHARDING)]
    assert optimizer.loaded == [{}]
    with pytest.raises(TrainerError, match="optimizer state of MegatronAdamW, this trainer steps ProjectAdamW"):
        cpu.load(tmp_path / "state")  # a GPU run's optimizer state cannot continue on the CPU lane's optimizer


def test_a_gpu_trainer_refuses_the_old_per_rank_format(stand_in, tmp_path):
    gpu = MegatronTrainer.from_recipe(load_recipe("tiny-cpu", SETS))
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "model.safetensors").write_bytes(b"")
    with pytest.raises(TrainerError, match="old: per-rank state of the project's AdamW .* megatron's distributed"):
        gpu.load(tmp_path / "old")


def test_a_nan_gradient_skips_megatrons_update_on_every_rank_and_the_next_one_steps(stand_in, monkeypatch):
    """megatron would apply a NaN gradient (no grad scaler in BF16: it clips by a NaN norm, which clips nothing, and
    steps); the trainer checks DDP's gradient buffers first and skips. The fault is injected the way the device check
    injects it (repro.train.faults)."""
    from repro.train.faults import NAN_GRADIENT_ENV

    gpu = MegatronTrainer.from_recipe(load_recipe("tiny-cpu", SETS))
    (optimizer,) = stand_in
    batch = make_megatron_batch(gpu.model, seed=5)
    batch.old_logprobs = gpu.logprobs(batch).logprobs
    before = [p.detach().clone() for p in gpu.model.parameters()]
    monkeypatch.setenv(NAN_GRADIENT_ENV, "1")
    skipped = gpu.train_step(batch)
    assert skipped["actor/grad_norm"] != skipped["actor/grad_norm"]  # NaN: the norm of a gradient holding a NaN
    assert all(torch.equal(a, b) for a, b in zip(before, gpu.model.parameters())) and optimizer.lrs == []
    assert all(torch.all(p.main_grad == 0) for p in gpu.model.parameters())  # nothing carried into the next update
    stepped = gpu.train_step(batch)
    assert stepped["actor/grad_norm"] > 0 and len(optimizer.lrs) == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, gpu.model.parameters()))


def test_the_precision_aware_optimizer_is_refused_without_transformer_engine_naming_it():
    """megatron-core 0.16.1's OptimizerConfig raises a bare TypeError there without TE (test_megatron_config.py):
    the trainer refuses first, saying what to install or change."""
    import importlib.util

    if importlib.util.find_spec("transformer_engine") is not None:
        pytest.skip("Transformer Engine is installed here")
    trainer = MegatronTrainer.from_recipe(load_recipe("tiny-cpu", SETS))
    options = dict(megatron_layout(load_recipe("amd-dsv4-flash-mi308x"))["optimizer"])
    assert options["use_precision_aware_optimizer"]
    with pytest.raises(TrainerError, match="Transformer Engine.*not installed here.*optimizer_cpu_offload"):
        optimizers.MegatronAdamW(trainer.model, options, {"use_distributed_optimizer": True})


def test_megatrons_optimizer_state_is_saved_in_a_format_that_reshards_every_dimension():
    """dp_reshardable (the format before) reshards "only in DP dimension"; the one used must be in megatron's own
    set of fully reshardable formats."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    format_ = optimizers.DISTRIB_OPTIM_SHARDING["distrib_optim_sharding_type"]
    assert format_ in DistributedOptimizer.checkpoint_fully_reshardable_formats
    assert optimizers.MegatronAdamW.checkpoint_format == format_
