"""The rollout numerics and the Sinkhorn loop as one compiled call each (``kernels/forward_ops.c``), same bits.

Why: at the tiny model's sizes every torch op costs 1-7 µs whatever its size, and a decode forward spent ~860
ops on the vLLM-like numerics hooks (``repro.rollout.numerics``: ~10 per W8A8 fake-quant, ~15 per KV round trip)
and ~1,250 per hyper-connection on its 20 Sinkhorn iterations (``repro.model.hyper_connection``). Here each is
one ``empty_like`` plus one C call over the tensor. Built at first use by ``repro.fp8.fused.build`` (same cache,
same compiler rules); each function returns None where the kernel cannot run -- no compiler, a dtype or layout
other than contiguous fp32 CPU, or a value whose torch rounding the kernel does not reproduce (a non-finite
input; see the C source) -- and the caller then runs its torch ops, which stay the reference.
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings

import torch

from repro.fp8 import fused

SOURCE = fused.SOURCE.with_name("forward_ops.c")
DISABLE_ENV = "REPRO_TORCH_FORWARD_OPS"
# positions the Sinkhorn kernel lays out entry-major at a time (CHUNK in the C source)
# set to 1: always the torch ops (A/B checks, debugging)
CHUNK = 256

_lock = threading.Lock()
_library = None  # the loaded library, False once building failed


def library():
    """The compiled library, or None (one warning) where it cannot be built or ``$REPRO_TORCH_FORWARD_OPS=1``."""
    global _library
    if os.environ.get(DISABLE_ENV) == "1":
        return None
    if _library is None:
        with _lock:
            if _library is None:
                try:
                    lib = ctypes.CDLL(str(fused.build(source=SOURCE)))
                    i64, ptr, f32, cint = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int
                    lib.repro_fake_quant_f32.argtypes = [ptr, ptr, i64, i64, i64, f32, f32, cint]
                    lib.repro_fake_quant_f32.restype = cint
                    lib.repro_bf16_round_f32.argtypes = [ptr, ptr, i64]
                    lib.repro_bf16_round_f32.restype = cint
                    lib.repro_kv_round_trip_f32.argtypes = [ptr, ptr, i64, i64, i64, i64, f32, f32]
                    lib.repro_kv_round_trip_f32.restype = cint
                    lib.repro_sinkhorn_f32.argtypes = [ptr, ptr, i64, i64, i64, f32]
                    lib.repro_sinkhorn_f32.restype = None
                    lib.repro_sinkhorn_save_f32.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64, f32]
                    lib.repro_sinkhorn_save_f32.restype = None
                    lib.repro_sinkhorn_backward_f32.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64]
                    lib.repro_sinkhorn_backward_f32.restype = None
                    _library = lib
                except (OSError, RuntimeError) as err:
                    warnings.warn(f"rollout numerics and Sinkhorn: using torch ops (slower): {err}", stacklevel=3)
                    _library = False
    return _library or None


def _fits(x: torch.Tensor) -> bool:
    return x.dtype == torch.float32 and x.device.type == "cpu" and x.is_contiguous() and not x.requires_grad


def fake_quant(x: torch.Tensor, group: int, limit: float, eps: float, fnuz: bool) -> torch.Tensor | None:
    """``numerics.fake_quant_activation`` (groups of ``group`` <= width channels), or None: see the module."""
    lib = library()
    if lib is None or not _fits(x) or x.numel() == 0 or x.shape[-1] % group:
        return None
    out = torch.empty_like(x)
    if lib.repro_fake_quant_f32(x.data_ptr(), out.data_ptr(), x.numel() // x.shape[-1], x.shape[-1], group,
                                limit, eps, fnuz):
        return None
    return out


def bf16_round(x: torch.Tensor) -> torch.Tensor | None:
    """``numerics.round_to_bf16`` of an fp32 tensor, or None: see the module."""
    lib = library()
    if lib is None or not _fits(x):
        return None
    out = torch.empty_like(x)
    if lib.repro_bf16_round_f32(x.data_ptr(), out.data_ptr(), x.numel()):
        return None
    return out


def kv_round_trip(x: torch.Tensor, rope: int, block: int, amax_floor: float, fp8_max: float) -> torch.Tensor | None:
    """``numerics.kv_cache_round_trip`` (``rope`` = 0: ``ue8m0_fp8_round_trip``), or None: see the module."""
    lib = library()
    if lib is None or not _fits(x) or x.numel() == 0 or (x.shape[-1] - rope) % block:
        return None
    out = torch.empty_like(x)
    if lib.repro_kv_round_trip_f32(x.data_ptr(), out.data_ptr(), x.numel() // x.shape[-1], x.shape[-1], rope,
                                   block, amax_floor, fp8_max):
        return None
    return out


def sinkhorn(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor | None:
    """``hyper_connection.sinkhorn_entrywise`` of comb [..., N, N] (no autograd), or None: see the module."""
    lib = library()
    if (lib is None or not _fits(comb) or comb.dim() < 2 or comb.shape[-1] != comb.shape[-2]
            or not 1 <= comb.shape[-1] <= 4 or iters < 1):
        return None
    out = torch.empty_like(comb)
    n = comb.shape[-1]
    lib.repro_sinkhorn_f32(comb.data_ptr(), out.data_ptr(), out.numel() // (n * n), n, iters, eps)
    return out


class _Sinkhorn(torch.autograd.Function):
    """The loop as one call each way; the backward is autograd's of the entrywise ops, op for op (see the C)."""

    @staticmethod
    def forward(ctx, comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
        n = comb.shape[-1]
        count, steps = comb.numel() // (n * n), 2 * iters - 1
        chunks = -(-count // CHUNK)
        states = torch.empty(chunks, steps + 1, 16, CHUNK)  # the C's layout: entry-major per chunk of positions
        totals = torch.empty(chunks, steps, 4, CHUNK)
        out = torch.empty_like(comb)
        library().repro_sinkhorn_save_f32(comb.data_ptr(), out.data_ptr(), states.data_ptr(), totals.data_ptr(),
                                          count, n, iters, eps)
        ctx.save_for_backward(states, totals)
        ctx.iters, ctx.count, ctx.n = iters, count, n
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        states, totals = ctx.saved_tensors
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        library().repro_sinkhorn_backward_f32(states.data_ptr(), totals.data_ptr(), grad.data_ptr(), out.data_ptr(),
                                              ctx.count, ctx.n, ctx.iters)
        return out, None, None


def sinkhorn_with_grad(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor | None:
    """``hyper_connection.sinkhorn_entrywise`` of comb [..., N, N] (N <= 4) under autograd, forward and backward one
    call each, or None: see the module."""
    lib = library()
    if (lib is None or comb.dtype != torch.float32 or comb.device.type != "cpu" or not comb.is_contiguous()
            or comb.dim() < 2 or comb.shape[-1] != comb.shape[-2] or not 1 <= comb.shape[-1] <= 4 or iters < 1
            or comb.numel() == 0):
        return None
    return _Sinkhorn.apply(comb, iters, eps)
