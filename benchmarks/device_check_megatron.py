"""The Megatron trainer's GPU-only paths, for a device check on one CUDA/ROCm GPU (each well under 2 minutes).

    from benchmarks.device_check_megatron import CHECKS
    for name, check in CHECKS:
        status, detail = check()        # status: "PASS", "FAIL" or "SKIP"

1. ``distributed optimizer step``: megatron-core's own optimizer as the trainer builds it on a GPU
   (``repro.train.megatron.optimizers.MegatronAdamW``: ``DistributedDataParallel`` + ``get_megatron_optimizer``
   with the AMD recipe's mapping -- distributed, CPU offload fraction 1.0 through ``HybridDeviceOptimizer``,
   precision-aware path, BF16 model) on a tiny GPT/MoE; one backward, one ``step(lr)``. PASS when the offloaded
   Adam state lives in host memory and the BF16 weights equal a torch AdamW step on fp32 copies of the same
   gradients (clipped by the same norm; no weight decay, which megatron skips on 1-D parameters) to BF16 rounding.
2. ``dist checkpoint save/load``: ``repro.train.megatron.dist_state`` with that model and optimizer on the GPU:
   save, load into a second model/optimizer built from another seed, and compare weights, the optimizer's
   sharded state and the CUDA RNG (and megatron's tracker states) bit for bit.

Both SKIP without a CUDA/ROCm device or without megatron-core. They start (or reuse) a one-rank NCCL world.
"""

from __future__ import annotations

import copy
import importlib.util
import socket
import tempfile
import traceback
from types import SimpleNamespace
from typing import Callable

LR = 1e-3
CLIP = 1.0


def _unavailable() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "no CUDA/ROCm device"
    if importlib.util.find_spec("megatron.core") is None:
        return "megatron-core is not installed"
    return None


def _te_version_stand_in() -> str:
    """megatron-core 0.16.1's OptimizerConfig asks Transformer Engine's version on the precision-aware path (CPU
    offload takes it) and crashes comparing None when TE is absent; with offload it returns before using TE. Where
    TE is missing, answer that one question (as tests/megatron/test_megatron_config.py does) and say so."""
    if importlib.util.find_spec("transformer_engine") is not None:
        return ""
    from megatron.core.optimizer import optimizer_config

    optimizer_config.is_te_min_version = lambda version, check_equality=True: True
    return " [no Transformer Engine here: megatron's TE version query answered by a stand-in]"


def _world() -> None:
    """A one-rank NCCL world with megatron's model-parallel groups at size 1 and its RNG tracker seeded."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1234)


def _model_and_optimizer(seed: int):
    """Tiny BF16 GPT/MoE on the GPU and the trainer's GPU optimizer with the AMD recipe's optimizer mapping."""
    import torch

    from repro.recipes import load_recipe
    from repro.train.precision import cast_for_training
    from repro.train.megatron.config import ddp_config, megatron_layout
    from repro.train.megatron.optimizers import MegatronAdamW
    from repro.train.megatron.tiny import build_tiny_gpt_moe

    # BF16 as MegatronTrainer casts a bf16 recipe's model; built on the host (use_cpu_initialization), then moved
    model = cast_for_training(build_tiny_gpt_moe(seed=seed, params_dtype=torch.bfloat16, bf16=True), "bf16").cuda()
    model.config.calculate_per_token_loss = True  # as MegatronTrainer sets it: each loss is already its share
    options = dict(megatron_layout(load_recipe("amd-dsv4-flash-mi308x"))["optimizer"], lr=LR, min_lr=LR,
                   clip_grad=CLIP, weight_decay=0.0)
    return model, MegatronAdamW(model, options, ddp_config(True))


def _backward(model) -> None:
    import torch

    from repro.train.megatron.model import forward_logits

    tokens = torch.randint(0, 25, (2, 16), generator=torch.Generator().manual_seed(0)).cuda()
    forward_logits(model, tokens).float().logsumexp(-1).mean().backward()


def _with_gradients():
    """(stand-in note, model, optimizer) on the one-rank world, seeded, with one backward's gradients in place."""
    note = _te_version_stand_in()
    _world()
    model, opt = _model_and_optimizer(seed=3)
    opt.zero_grad()
    _backward(model)
    return note, model, opt


def check_distributed_optimizer_step() -> tuple[str, str]:
    why = _unavailable()
    if why:
        return "SKIP", why
    try:
        import torch

        note, model, opt = _with_gradients()
        names = [n for n, _ in model.named_parameters()]
        params = [p for _, p in model.named_parameters()]
        masters = [torch.nn.Parameter(p.detach().float().clone()) for p in params]
        grads = [p.main_grad.detach().float().clone() for p in params]  # DP world 1: finalize leaves them
        norm = opt.step(LR)
        for m, g in zip(masters, grads):
            m.grad = g
        want_norm = float(torch.nn.utils.clip_grad_norm_(masters, CLIP))
        # the AMD mapping's betas/eps (the recipe's); megatron's CPU Adam is torch's fused AdamW
        cfg = opt.optimizer.config
        reference = torch.optim.AdamW(masters, lr=LR, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps,
                                      weight_decay=0.0)
        reference.step()
        offloaded = [t.device.type for state in _adam_states(opt.optimizer) for t in state.values()
                     if isinstance(t, torch.Tensor) and t.dim() > 0]
        if not offloaded or set(offloaded) != {"cpu"}:
            return "FAIL", f"offloaded Adam state devices {sorted(set(offloaded))}, want only cpu"
        worst, where = 0.0, ""
        for name, p, m in zip(names, params, masters):
            diff = float((p.detach().float() - m.detach().to(torch.bfloat16).float()).abs().max())
            if diff > worst:
                worst, where = diff, name
        ulp = float(max(float(m.detach().abs().max()) for m in masters)) * 2 ** -7
        detail = (f"{type(opt.optimizer).__name__}, norm {norm:.6g} vs reference {want_norm:.6g}, "
                  f"max |w - ref| {worst:.3g} at {where} (BF16 ulp at max |w|: {ulp:.3g}), "
                  f"{len(offloaded)} Adam tensors on cpu{note}")
        ok = abs(norm - want_norm) <= 1e-3 * want_norm and worst <= ulp
        return ("PASS" if ok else "FAIL"), detail
    except Exception:
        return "FAIL", traceback.format_exc(limit=6)


def _adam_states(optimizer) -> list[dict]:
    """Per-parameter states of the torch Adams inside megatron's optimizer: a ChainedOptimizer (dense, experts) of
    DistributedOptimizers, each over a HybridDeviceOptimizer whose sub-optimizers hold the state."""
    from megatron.core.optimizer import ChainedOptimizer
    from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer

    parts = optimizer.chained_optimizers if isinstance(optimizer, ChainedOptimizer) else [optimizer]
    states = []
    for part in parts:
        if not isinstance(part.optimizer, HybridDeviceOptimizer):
            raise TypeError(f"expected megatron's HybridDeviceOptimizer (CPU offload), got {type(part.optimizer).__name__}")
        states += [state for sub in part.optimizer.sub_optimizers for state in sub.state.values()]
    return states


def check_dist_checkpoint() -> tuple[str, str]:
    why = _unavailable()
    if why:
        return "SKIP", why
    try:
        import torch

        from repro.train.megatron.dist_state import load_state, read_meta, rng_states, save_state

        note, model, opt = _with_gradients()
        opt.step(LR)
        saved = SimpleNamespace(model=model, opt=opt, step=1, updates=1, dtype_name="bf16")
        rng = {k: v.clone() for k, v in rng_states().items()}
        with tempfile.TemporaryDirectory() as tmp:
            folder = save_state(saved, f"{tmp}/state")
            torch.cuda.manual_seed(99)  # the CUDA RNG moves on; load must put it back
            other, other_opt = _model_and_optimizer(seed=11)
            loaded = SimpleNamespace(model=other, opt=other_opt, step=0, updates=0, dtype_name="bf16",
                                     resharded_from=None)
            load_state(loaded, folder, read_meta(folder))
            want = copy.deepcopy(opt.optimizer.state_dict())
            got = other_opt.optimizer.state_dict()
        bad = [n for (n, a), b in zip(model.named_parameters(), other.parameters()) if not torch.equal(a, b)]
        bad_rng = [k for k, v in rng_states().items() if not torch.equal(v, rng[k])]
        bad_opt = _diff(want, got)
        detail = (f"{len(list(model.parameters()))} weights, optimizer state, RNG {sorted(rng)}; mismatched: "
                  f"weights {bad[:3]}, optimizer {bad_opt[:3]}, rng {bad_rng}{note}")
        ok = not bad and not bad_rng and not bad_opt and loaded.step == 1
        return ("PASS" if ok else "FAIL"), detail
    except Exception:
        return "FAIL", traceback.format_exc(limit=6)


def _diff(a, b, path: str = "") -> list[str]:
    """Paths where two nested optimizer state dicts differ (tensors compared bit for bit)."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a.cpu(), b.cpu())
        return [] if same else [path]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path} keys"]
        return [d for k in a for d in _diff(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path} length"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [path]


CHECKS: list[tuple[str, Callable[[], tuple[str, str]]]] = [
    ("megatron distributed optimizer step (CPU offload)", check_distributed_optimizer_step),
    ("megatron dist checkpoint save/load", check_dist_checkpoint),
]


if __name__ == "__main__":
    for check_name, check in CHECKS:
        status, text = check()
        print(f"{status:4}  {check_name}: {text}")
