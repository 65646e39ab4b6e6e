"""How the BF16 trainer computes its GEMMs on a CPU: torch's own BF16 matmul, or an FP32 GEMM of the BF16 operands
with the output rounded once to BF16. Chosen once per trainer, by the CPU's capability unless the recipe or the
environment names a path.

Why two paths: torch runs a BF16 matmul on a CPU through oneDNN where oneDNN has BF16 kernels for it (AVX512 or
AMX CPUs: ``avx512_bf16``, ``amx_bf16``; there it is faster than FP32). Elsewhere -- AVX2-only CPUs, which most
laptops and many cloud VMs are, or ``torch.backends.mkldnn`` switched off -- it falls back to ATen's reference
BF16 kernel at ~1 GFLOP/s, 100x slower than torch's FP32 matmul on the same CPU (``benchmarks/bench_bf16_gemm.py``;
docs/performance.md). There the tiny trainer's update took 3.4 s a step instead of 0.4 s.

What the ``fp32`` path computes: each GEMM whose floating operands are all BF16 runs as torch's FP32 GEMM of the
same (exactly widened) values and its result is rounded to BF16 once -- a GPU BF16 GEMM's semantics: the products
of two 8-bit significands are exact in FP32, they are accumulated in FP32, and only the output is rounded (to
nearest even). Gradients follow from autograd through the widening, the FP32 GEMM and the rounding: each
gradient GEMM is an FP32 GEMM too, and its result is rounded once to BF16 on its way back to the BF16 operand's
gradient, as a BF16 backward GEMM writes it. Everything that is not a GEMM (norms, softmax, elementwise ops)
stays BF16 as on the native path. torch's oneDNN BF16 GEMM also accumulates in FP32 and rounds once, in its own
blocking order, so the two paths differ by the order of FP32 additions: at most 1 ulp of BF16 on the tiny
model's GEMMs (``benchmarks/bench_bf16_gemm.py --ulp``; docs/performance.md).

How: a ``TorchFunctionMode`` (torch's own hook on every torch function called from Python) is entered around the
trainer's forward passes; it hands the GEMM functions in ``GEMM_FUNCTIONS`` to the FP32 path when all their
floating operands are BF16 and passes every other call through untouched. It covers every GEMM call site of the
model -- transformers' linears, the grouped ``o_a_proj`` bmm, the routed experts' ``grouped_mm``, the eager
attention's and the hyper-connections' matmuls, the routers -- without copying any of transformers' modules, and
the backward needs no mode (autograd recorded the FP32 GEMMs). The tiny model's forward makes ~2,300 torch calls:
the mode's cost is well under 1% of a forward (measured). A call whose operands torch itself would refuse (BF16
with FP32) is passed through, so torch still raises.

Which path (``resolve_bf16_gemm``): the recipe's ``actor.bf16_gemm`` (``auto``, ``native`` or ``fp32``), or, when
it says ``auto``, the ``REPRO_BF16_GEMM`` environment variable; ``auto`` with neither is ``native`` exactly when
torch would run BF16 matmuls through oneDNN here (``native_bf16_matmul``). One trainer never mixes the paths; its
train steps report which one it took (``actor/bf16_gemm_fp32``, 1 or 0) and its checkpoints record it, so a resume
on a CPU that would choose the other path is refused rather than silently continued (``check_resumed_path``).
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from typing import Any, Callable, ContextManager

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from repro.errors import SettingRefused
from repro.train.base import TrainerError

NATIVE, FP32 = "native", "fp32"
PATHS = (NATIVE, FP32)
CHOICES = ("auto", *PATHS)
ENV_VAR = "REPRO_BF16_GEMM"

# torch's GEMM entry points that a model calls from Python (functions and Tensor methods); their backward GEMMs are
# autograd's and follow from the forward's dtypes
GEMM_FUNCTIONS: frozenset[Callable] = frozenset(f for f in (
    torch.matmul, torch.mm, torch.bmm, torch.addmm, torch.baddbmm, torch.addbmm, torch.einsum, F.linear,
    getattr(torch, "_grouped_mm", None), getattr(F, "grouped_mm", None),
    torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__, torch.Tensor.mm, torch.Tensor.bmm,
    torch.Tensor.addmm, torch.Tensor.baddbmm,
) if f is not None)


class BF16GemmError(TrainerError, ValueError):
    """A BF16 GEMM path asked for by name that is not one, or two sources asking for different paths."""


class BF16GemmResumeError(BF16GemmError, SettingRefused):
    """A saved trainer state took the other BF16 GEMM path than this trainer would."""


def native_bf16_matmul() -> bool:
    """Whether torch runs BF16 matmuls through oneDNN on this CPU: oneDNN built in and enabled
    (``torch.backends.mkldnn``) and able to compute BF16 here (its ISA check: AVX512 or AMX; an AVX2-only CPU, or
    ``DNNL_MAX_CPU_ISA=AVX2``, says no). Otherwise torch's BF16 matmul is ATen's ~1 GFLOP/s fallback."""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return False
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def cpu_bf16_facts() -> dict[str, Any]:
    """What decides the path here, for records and ``repro check``: torch's CPU capability, the CPU's BF16 flags,
    whether oneDNN computes BF16 here, ``$REPRO_BF16_GEMM``, and what ``auto`` picks (None, with ``refused``
    saying why, where that variable names no path)."""
    native, env = native_bf16_matmul(), os.environ.get(ENV_VAR)
    facts = {"cpu_capability": torch.backends.cpu.get_cpu_capability(),
             "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()),
             "amx": bool(torch.cpu._is_amx_tile_supported()), "onednn_bf16": native, "env": env, "path": None}
    try:
        facts["path"] = choose_path("auto", env, native)
    except BF16GemmError as err:
        facts["refused"] = str(err)
    return facts


def measure_paths(size: int = 256, repeats: int = 3) -> dict[str, float]:
    """GFLOP/s of torch's BF16 matmul and of the fp32 path on [size, size] BF16 operands here, best of ``repeats``
    and on one thread, as the Ray workers compute (at 256: ~0.2 ms on a CPU with native BF16, ~10 ms on an AVX2-only
    one; on a busy machine a multi-threaded GEMM measures the other jobs)."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=g).to(torch.bfloat16) for _ in range(2))
    rates, threads = {}, torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, run in ((NATIVE, lambda: a @ b), (FP32, lambda: fp32_gemm(torch.matmul, (a, b), {}))):
            run()
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                run()
                best = min(best, time.perf_counter() - start)
            rates[name] = 2 * size**3 / best / 1e9
    finally:
        torch.set_num_threads(threads)
    return rates


def resolve_bf16_gemm(requested: str = "auto") -> str:
    """The path a trainer takes here: ``choose_path`` with this process's ``$REPRO_BF16_GEMM`` and CPU."""
    return choose_path(requested, os.environ.get(ENV_VAR), native_bf16_matmul)


def choose_path(requested: str, env: str | None, native: bool | Callable[[], bool]) -> str:
    """``requested`` (the recipe's ``actor.bf16_gemm``) if it names a path, else ``env`` (``$REPRO_BF16_GEMM``) if
    it does, else ``native`` where the CPU has native BF16 matmul (``native``: the answer, or how to get it) and
    ``fp32`` elsewhere. A recipe and an environment that name different paths, or an unknown name in either, raise
    ``BF16GemmError``."""
    if requested not in CHOICES:
        raise BF16GemmError(f"actor.bf16_gemm: {requested!r} is not one of {', '.join(CHOICES)}")
    env = (env or "").strip()
    if env and env not in CHOICES:
        raise BF16GemmError(f"{ENV_VAR}={env!r} is not one of {', '.join(CHOICES)}")
    if requested != "auto":
        if env not in ("", "auto", requested):
            raise BF16GemmError(f"actor.bf16_gemm is {requested!r} but {ENV_VAR}={env!r}: unset one, or make them "
                                "agree")
        return requested
    if env in PATHS:
        return env
    return NATIVE if (native() if callable(native) else native) else FP32


def _is_bf16(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16


def _floating(values) -> list[torch.Tensor]:
    """The floating tensors among ``values`` and one level of lists/tuples in it (``einsum``'s operand list)."""
    found = []
    for value in values:
        for item in (value if isinstance(value, (list, tuple)) else (value,)):
            if isinstance(item, torch.Tensor) and item.is_floating_point():
                found.append(item)
    return found


def _widened(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(_widened(v) for v in value)
    return value.float() if _is_bf16(value) else value


def fp32_gemm(func: Callable, args: tuple, kwargs: dict) -> torch.Tensor:
    """``func(*args, **kwargs)`` computed on the BF16 operands widened to FP32 (exact), the result rounded once to
    BF16; an ``out=`` tensor receives the rounded result. Under autograd the gradients of the BF16 operands are the
    FP32 backward GEMMs rounded once to BF16."""
    out = kwargs.pop("out", None)
    result = func(*_widened(args), **{k: _widened(v) for k, v in kwargs.items()}).to(torch.bfloat16)
    if out is not None:
        return out.copy_(result)
    return result


class FP32Gemms(TorchFunctionMode):
    """While active (in the thread that entered it): every call of a ``GEMM_FUNCTIONS`` member whose floating
    operands are all BF16 is computed by ``fp32_gemm``; every other torch call runs as it would without the mode."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in GEMM_FUNCTIONS:
            floating = _floating((*args, *kwargs.values()))
            if floating and all(t.dtype == torch.bfloat16 for t in floating):
                return fp32_gemm(func, args, dict(kwargs))
        return func(*args, **kwargs)


def gemm_context(path: str) -> Callable[[], ContextManager]:
    """What a trainer enters around each forward for ``path``: a fresh ``FP32Gemms`` mode, or nothing."""
    if path not in PATHS:
        raise BF16GemmError(f"BF16 GEMM path {path!r} is not one of {', '.join(PATHS)}")
    return FP32Gemms if path == FP32 else nullcontext


def check_resumed_path(saved: str | None, current: str, where: str) -> None:
    """Refuse to continue a state saved by a trainer on the other path (None: saved before paths were recorded)."""
    if saved is not None and saved != current:
        raise BF16GemmResumeError(
            f"{where}: this run's trainer computed its BF16 GEMMs on the {saved!r} path; this one would take "
            f"{current!r}. Continue it as it started: set actor.bf16_gemm={saved} (or {ENV_VAR}={saved})")
