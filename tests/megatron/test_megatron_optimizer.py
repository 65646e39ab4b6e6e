"""The Megatron trainer's optimizer choice (repro.train.megatron.optimizers): megatron's own on a GPU, the project's
AdamW on CPU. megatron-core 0.16.1's optimizers cannot be built without CUDA (checked below), so the GPU path runs
here against a STAND-IN for the object ``get_megatron_optimizer`` returns: only its device step is replaced (fp32
AdamW, clip by the global norm). Everything around it is megatron's real code on CPU: ``OptimizerConfig`` from the
recipe, ``DistributedDataParallel`` and its fp32 gradient buffers fed by its own backward hooks through megatron's
schedule, ``finalize_model_grads``, and the dist checkpoint that calls the optimizer's ``sharded_state_dict``."""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed here: `make test-megatron` runs this lane in .venv-megatron")

import torch  # noqa: E402

import repro.train.megatron.optimizers as optimizers  # noqa: E402
import repro.train.megatron.trainer as trainer_module  # noqa: E402
from repro.recipes import load_recipe  # noqa: E402
from repro.train.base import TrainerError  # noqa: E402
from repro.train.megatron.config import megatron_layout  # noqa: E402
from repro.train.megatron.trainer import MegatronTrainer  # noqa: E402
from test_megatron_contract import make_megatron_batch, one_thread  # noqa: E402,F401

SETS = ["actor.dtype=fp32", "actor.backend=megatron", "actor.model_provider=repro.train.megatron.tiny:provider",
        "actor.num_workers=1", "actor.max_tokens_per_micro_batch=40", "optim.lr=0.001", "optim.grad_clip=0.05",
        "optim.warmup_steps=2", "optim.weight_decay=0.1", "seed=3"]


class StandInMegatronOptimizer:
    """STAND-IN for megatron's optimizer on a GPU (FP32Optimizer / DistributedOptimizer over HybridDeviceOptimizer):
    fp32 masters stepped by torch's AdamW from DDP's ``main_grad`` buffers, clipped by their global norm, copied
    back -- what megatron does on the device, without its CUDA-only kernels. It records what our side hands it."""

    def __init__(self, config, model_chunks):
        self.config, self.chunks = config, model_chunks
        self.params = list(model_chunks[0].module.parameters())
        self.masters = [torch.nn.Parameter(p.detach().float().clone()) for p in self.params]
        self.inner = torch.optim.AdamW(self.masters, lr=config.lr, betas=(config.adam_beta1, config.adam_beta2),
                                       eps=config.adam_eps, weight_decay=config.weight_decay)
        self.param_groups = self.inner.param_groups
        self.lrs, self.state_calls, self.loaded = [], [], []

    def zero_grad(self):
        for m in self.masters:
            m.grad = None

    def get_grad_norm(self):
        return torch.nn.utils.get_total_norm([p.main_grad for p in self.params])

    def step(self):
        for master, p in zip(self.masters, self.params):
            master.grad = p.main_grad.float().clone()
        norm = torch.nn.utils.get_total_norm([m.grad for m in self.masters])
        torch.nn.utils.clip_grads_with_norm_(self.masters, self.config.clip_grad, norm)
        self.lrs.append(self.param_groups[0]["lr"])
        self.inner.step()
        with torch.no_grad():
            for master, p in zip(self.masters, self.params):
                p.copy_(master)
        return True, float(norm), 0

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
    monkeypatch.setattr(trainer_module, "trainer_optimizer", functools.partial(optimizers.trainer_optimizer, on_gpu=True))
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
        patch.setattr(trainer_module, "trainer_optimizer", functools.partial(optimizers.trainer_optimizer, on_gpu=False))
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
    print(f"\nstand-in megatron optimizer vs project AdamW, max |dw| per step: {gaps}")

    gpu.save(tmp_path / "state")  # the dist checkpoint asks megatron's optimizer for its sharded state
    gpu.load(tmp_path / "state")
    assert optimizer.state_calls == [(False, optimizers.DISTRIB_OPTIM_SHARDING), (True, optimizers.DISTRIB_OPTIM_SHARDING)]
    assert optimizer.loaded == [{}]
    with pytest.raises(TrainerError, match="optimizer state of MegatronAdamW, this trainer steps ProjectAdamW"):
        cpu.load(tmp_path / "state")  # a GPU run's optimizer state cannot continue on the CPU lane's optimizer


def test_a_gpu_trainer_refuses_the_old_per_rank_format(stand_in, tmp_path):
    gpu = MegatronTrainer.from_recipe(load_recipe("tiny-cpu", SETS))
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "model.safetensors").write_bytes(b"")
    with pytest.raises(TrainerError, match="old: per-rank state of the project's AdamW .* megatron's distributed"):
        gpu.load(tmp_path / "old")
