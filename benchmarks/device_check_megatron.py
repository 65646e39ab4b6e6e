"""The Megatron trainer on one CUDA/ROCm GPU with AMD's optimizer mapping, for benchmarks/device_check.py.

    from device_check_megatron import CHECKS
    for name, check in CHECKS:
        status, detail = check()        # status: "PASS", "FAIL" or "SKIP"

AMD's trainer steps megatron's distributed optimizer, CPU-offloaded (``HybridDeviceOptimizer``) on the
precision-aware path with BF16 moments. ``repro launch`` on one GPU has one trainer rank, which builds no distributed
optimizer, so these checks build the same MegatronTrainer a rank of AMD's layout builds -- its constructor with
``megatron_layout(amd recipe)``'s optimizer and DDP settings -- in a one-rank world joined the way a rank joins
(``init_distributed_from_env``), on the tiny GPT/MoE built on the host as the tiny provider builds it. The trainer
moves the model and each micro-batch to the GPU itself; nothing is moved by hand.

0. ``megatron_trainer_step``: a lone rank's trainer (megatron's non-distributed optimizer: no TE needed) on a batch
   with non-zero advantages: ``actor/grad_norm`` equals the accumulated gradient's norm, an injected NaN gradient
   skips its update, the next one steps (the launch's untrained model scores no reward, so its advantages are 0).
1. ``megatron_offloaded_optimizer_step``: one ``train_step``: PASS when the offloaded Adam state lives in host
   memory, ``actor/grad_norm`` is the norm of the gradient the trainer accumulated, and the BF16 weights equal a torch
   AdamW step on fp32 copies of that gradient (clipped by the same norm; no weight decay) to BF16 rounding.
2. ``megatron_dist_checkpoint``: ``trainer.save`` then ``load`` into a second trainer built from another seed:
   weights, megatron's optimizer state (fully reshardable format) and the RNG states equal bit for bit.

Both SKIP without a GPU or megatron-core. Without Transformer Engine, megatron-core 0.16.1 cannot configure the
precision-aware optimizer: the trainer refuses, naming TE, and the checks SKIP quoting that refusal.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import socket
import tempfile
import traceback
from typing import Callable

LR = 1e-3
CLIP = 1.0
CPU_DRY_RUN = False  # device_check.py --cpu-dry-run: megatron_trainer_step runs on the CPU lane's optimizer too


def _unavailable(cpu_ok: bool = False) -> str | None:
    import torch

    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        return "megatron-core is not installed"
    if not torch.cuda.is_available() and not (cpu_ok and CPU_DRY_RUN):
        return "no CUDA/ROCm device"
    return None


def _join_world() -> None:
    """A one-rank world, joined as every trainer rank joins (RANK/WORLD_SIZE/MASTER_* in its environment)."""
    from repro.train.megatron.parallel import init_distributed_from_env

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)}.items():
        os.environ.setdefault(key, value)
    init_distributed_from_env()


def _trainer(seed: int):
    """MegatronTrainer as a rank of AMD's layout builds it (distributed, offloaded, BF16 moments), tiny model."""
    from repro.recipes import load_recipe
    from repro.recipes.schema import OptimConfig
    from repro.train.megatron.config import ddp_config, megatron_layout
    from repro.train.megatron.tiny import build_tiny_gpt_moe
    from repro.train.megatron.trainer import MegatronTrainer
    from repro.train.grpo_update import TrainerSettings

    _join_world()
    amd = load_recipe("amd-dsv4-flash-mi308x")
    optimizer = dict(megatron_layout(amd)["optimizer"], lr=LR, min_lr=LR, clip_grad=CLIP, weight_decay=0.0)
    optim = OptimConfig(lr=LR, weight_decay=0.0, grad_clip=CLIP, warmup_steps=0, betas=list(amd.optim.betas),
                        eps=amd.optim.eps)
    settings = TrainerSettings(dtype="bf16", max_tokens_per_micro_batch=16384, temperature=1.0, optim=optim,
                               replay_routing=False)
    return MegatronTrainer(build_tiny_gpt_moe(seed=seed), settings, distributed_optimizer=True, optimizer_offload=True,
                           megatron_optimizer=optimizer, megatron_ddp=ddp_config(True))


def _batch():
    """A host batch as the loop hands one over: 4 rows of prompt + response, no recorded routing."""
    import torch

    from repro.model.tiny import BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID, TINY_VOCAB_SIZE
    from repro.rollout.types import FinishReason, Trajectory
    from repro.train.batch import build_batch

    gen = torch.Generator().manual_seed(0)
    rows = [Trajectory(i // 2, i % 2, [BOS_TOKEN_ID] + torch.randint(3, TINY_VOCAB_SIZE, (6,), generator=gen).tolist(),
                       torch.randint(3, TINY_VOCAB_SIZE, (3 + i,), generator=gen).tolist() + [EOS_TOKEN_ID],
                       torch.zeros(4 + i), FinishReason.EOS, weight_version=0) for i in range(4)]
    return build_batch(rows, torch.tensor([1.0, -1.0, 0.5, -0.5]), PAD_TOKEN_ID, with_routing=False)


class _Refused(Exception):
    """The trainer refused AMD's optimizer mapping without Transformer Engine, as it must: the checks SKIP, quoting."""


def _amd_trainer_with_batch(seed: int):
    """(AMD-mapped trainer, a host batch with its pi_old); ``_Refused`` where TE is missing and the trainer said so."""
    try:
        trainer = _trainer(seed)
    except Exception as err:
        if "Transformer Engine" in str(err) and importlib.util.find_spec("transformer_engine") is None:
            raise _Refused(f"the trainer refused, as it must without Transformer Engine: {err}") from err
        raise
    batch = _batch()
    batch.old_logprobs = trainer.logprobs(batch, replay_routing=False).logprobs
    return trainer, batch


def check_trainer_step() -> tuple[str, str]:
    """A lone rank's trainer (megatron's non-distributed optimizer, no Transformer Engine needed) on a batch with
    non-zero advantages: ``actor/grad_norm`` is the norm of the gradient it accumulated, a NaN injected into the next
    update's gradient skips it (weights unchanged), and the update after that steps."""
    why = _unavailable(cpu_ok=True)
    if why:
        return "SKIP", why
    try:
        import torch

        from repro.recipes.schema import OptimConfig
        from repro.train.faults import NAN_GRADIENT_ENV
        from repro.train.megatron.tiny import build_tiny_gpt_moe
        from repro.train.megatron.trainer import MegatronTrainer
        from repro.train.grpo_update import TrainerSettings

        if torch.cuda.is_available():
            _join_world()  # on a CPU the trainer's shim makes its one-rank gloo world
        optim = OptimConfig(lr=LR, weight_decay=0.0, grad_clip=CLIP, warmup_steps=0)
        settings = TrainerSettings(dtype="bf16", max_tokens_per_micro_batch=16384, temperature=1.0,
                                   replay_routing=False, optim=optim)
        trainer = MegatronTrainer(build_tiny_gpt_moe(seed=3), settings)
        batch = _batch()
        batch.old_logprobs = trainer.logprobs(batch, replay_routing=False).logprobs
        want = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float())
                                                           for g in trainer.gradients(batch).values()])))
        norm = trainer.train_step(batch)["actor/grad_norm"]
        before = [p.detach().clone() for p in trainer.model.parameters()]
        os.environ[NAN_GRADIENT_ENV] = str(trainer.updates + 1)
        try:
            skipped = trainer.train_step(batch)["actor/grad_norm"]
        finally:
            del os.environ[NAN_GRADIENT_ENV]
        unchanged = all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
        after = trainer.train_step(batch)["actor/grad_norm"]
        moved = any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
        detail = (f"{type(trainer.opt).__name__} on {trainer.device}: grad_norm {norm:.6g} vs the "
                  f"accumulated gradient's {want:.6g}; NaN update: norm {skipped}, weights unchanged {unchanged}; "
                  f"next update: norm {after:.6g}, weights moved {moved}")
        ok = 0 < norm and abs(norm - want) <= 1e-3 * want and skipped != skipped and unchanged and moved
        return ("PASS" if ok else "FAIL"), detail
    except _Refused as refused:
        return "SKIP", str(refused)
    except Exception:
        return "FAIL", traceback.format_exc(limit=6)


def check_offloaded_optimizer_step() -> tuple[str, str]:
    why = _unavailable()
    if why:
        return "SKIP", why
    try:
        import torch

        trainer, batch = _amd_trainer_with_batch(seed=3)
        grads = trainer.gradients(batch)  # the accumulated gradient the update will see (this rank holds it all)
        masters = {n: torch.nn.Parameter(p.detach().float().clone()) for n, p in trainer.model.named_parameters()}
        metrics = trainer.train_step(batch)
        for name, master in masters.items():
            master.grad = grads[name].float().to(master.device)
        want_norm = float(torch.nn.utils.clip_grad_norm_(list(masters.values()), CLIP))
        cfg = trainer.opt.optimizer.config
        torch.optim.AdamW(list(masters.values()), lr=LR, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps,
                          weight_decay=0.0).step()
        offloaded = sorted({t.device.type for state in _adam_states(trainer.opt.optimizer) for t in state.values()
                            if isinstance(t, torch.Tensor) and t.dim() > 0})
        worst, where = 0.0, ""
        for name, p in trainer.model.named_parameters():
            diff = float((p.detach().float() - masters[name].detach().to(torch.bfloat16).float()).abs().max())
            if diff > worst:
                worst, where = diff, name
        ulp = max(float(m.detach().abs().max()) for m in masters.values()) * 2 ** -7
        norm = metrics["actor/grad_norm"]
        detail = (f"{type(trainer.opt.optimizer).__name__} on {trainer.device}; grad_norm {norm:.6g} vs "
                  f"{want_norm:.6g}; max |w - ref| {worst:.3g} at {where} (BF16 ulp at max |w|: {ulp:.3g}); "
                  f"Adam state on {offloaded}")
        ok = offloaded == ["cpu"] and abs(norm - want_norm) <= 1e-3 * want_norm and worst <= ulp
        return ("PASS" if ok else "FAIL"), detail
    except _Refused as refused:
        return "SKIP", str(refused)
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
            raise TypeError("expected megatron's HybridDeviceOptimizer (CPU offload), got "
                            f"{type(part.optimizer).__name__}")
        states += [state for sub in part.optimizer.sub_optimizers for state in sub.state.values()]
    return states


def check_dist_checkpoint() -> tuple[str, str]:
    why = _unavailable()
    if why:
        return "SKIP", why
    try:
        import torch

        from repro.train.megatron.dist_state import rng_states

        saved, batch = _amd_trainer_with_batch(seed=3)
        saved.train_step(batch)
        rng = {k: v.clone() for k, v in rng_states().items()}
        with tempfile.TemporaryDirectory() as tmp:
            folder = saved.save(f"{tmp}/state")
            torch.cuda.manual_seed(99)  # the CUDA RNG moves on; load must put it back
            loaded = _trainer(seed=11)
            loaded.load(folder)
        want = copy.deepcopy(saved.opt.optimizer.state_dict())
        got = loaded.opt.optimizer.state_dict()
        pairs = zip(saved.model.named_parameters(), loaded.model.parameters())
        bad = [n for (n, a), b in pairs if not torch.equal(a, b)]
        bad_rng = [k for k, v in rng_states().items() if not torch.equal(v, rng[k])]
        bad_opt = _diff(want, got)
        detail = (f"{len(list(saved.model.parameters()))} weights, optimizer state ({saved.opt.checkpoint_format}), "
                  f"RNG {sorted(rng)}; mismatched: weights {bad[:3]}, optimizer {bad_opt[:3]}, rng {bad_rng}")
        ok = not bad and not bad_rng and not bad_opt and loaded.step == 1
        return ("PASS" if ok else "FAIL"), detail
    except _Refused as refused:
        return "SKIP", str(refused)
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
    ("megatron_trainer_step", check_trainer_step),
    ("megatron_offloaded_optimizer_step", check_offloaded_optimizer_step),
    ("megatron_dist_checkpoint", check_dist_checkpoint),
]


if __name__ == "__main__":
    for check_name, check in CHECKS:
        status, text = check()
        print(f"{status:4}  {check_name}: {text}")
