"""The CPU quantiser of one BF16 slab as one compiled call (`kernels/quantize_bf16.c`), with the GIL released.

`quant._quantize_slab` does a slab in ~12 eager torch ops, each a pass over the slab (bf16 -> fp32 copy, |x|,
block amax, multiply, cast, then the error check's bit decoding, subtraction and norms): 1.0-1.7 CPU-seconds
per GB of BF16 on this kind of CPU. The C kernel makes two passes over the slab's BF16 bits: the block amax as
the largest magnitude bit pattern, then per row the scale-and-cast and the error figures, on data in L1
(~0.5 CPU-s/GB). ctypes releases the GIL for the call, so the converter's slab threads use every core.

Same bytes as the torch path (tests/test_fp8_fused.py; every fp32 pattern the quantiser can produce is checked
against torch's cast by benchmarks/bench_fp8_fused.py); the error figures are summed in another order (fp32
per 128-element block, float64 across blocks) and agree with the torch path's to rounding.

The kernel is compiled on first use with the system C compiler (`$CC`, else cc/gcc/clang) for this CPU
(-march=native) and cached under `$REPRO_CACHE_DIR` (default ~/.cache/repro), keyed by the source, the flags,
the compiler and the CPU's feature flags, so a home directory shared by different machines gets one build
each. Why not numba: importing it adds ~115 MiB to every process's RSS (the converter's peak was 328 MiB),
and why not torch.compile: its kernels hold the GIL and it compiles in 18 s. Without a compiler the torch ops
are used, with one warning.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("kernels") / "quantize_bf16.c"
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp-simd", "-std=c11", "-fPIC", "-shared"]
FIGURES = 6  # [||deq| - |x||_2, ||x||_2, max ||deq| - |x||, the same, NaN code, max |x|]

_lock = threading.Lock()
_kernel = None  # the loaded function, False once building failed
_library = None  # the loaded shared library (also holds `repro_fp8_cast_f32`)


def cache_dir() -> Path:
    return Path(os.environ.get("REPRO_CACHE_DIR") or Path.home() / ".cache" / "repro")


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return os.uname().machine


def build(cc: str | None = None, directory: Path | None = None, source: Path = SOURCE) -> Path:
    """Compile ``source`` (a C file of ``kernels/``; once per source, the folder's headers, flags, compiler and
    CPU) and return the shared library's path. Raises RuntimeError naming the compiler and its message when it
    fails."""
    cc = cc or _compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set CC, or install cc/gcc/clang)")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    headers = [h.read_text() for h in sorted(source.parent.glob("*.h"))]
    key = hashlib.sha256("\0".join([source.read_text(), *headers, *FLAGS, version, _cpu_flags()]).encode()
                         ).hexdigest()[:16]
    directory = directory or cache_dir()
    target = directory / f"{source.stem}-{key}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:  # built aside, renamed whole: no half-written library
        out = Path(tmp) / target.name
        for flags in (FLAGS, [f for f in FLAGS if f != "-march=native"]):  # some compilers lack -march=native
            proc = subprocess.run([cc, *flags, f"-I{source.parent}", "-o", str(out), str(source), "-lm"],
                                  capture_output=True, text=True)
            if proc.returncode == 0:
                break
        else:
            raise RuntimeError(f"{cc} could not build {source}: {proc.stderr.strip()[-2000:]}")
        os.replace(out, target)
    return target


def kernel():
    """The compiled function, or None (with one warning) where it cannot be built."""
    global _kernel, _library
    with _lock:
        if _kernel is None:
            try:
                lib = ctypes.CDLL(str(build()))
                fn = lib.repro_fp8_quantize_bf16
                i64, ptr, dbl = ctypes.c_int64, ctypes.c_void_p, ctypes.c_double
                fn.argtypes = [ptr, i64, ptr, i64, i64, i64, ptr, i64, i64, i64, i64, ctypes.c_float, ctypes.c_float,
                               ctypes.c_int, ctypes.c_int, dbl, dbl, ptr]
                fn.restype = ctypes.c_int
                lib.repro_fp8_cast_f32.argtypes = [ptr, ptr, i64, ctypes.c_int]
                lib.repro_fp8_cast_f32.restype = None
                _kernel, _library = fn, lib
            except (OSError, RuntimeError) as err:
                warnings.warn(f"FP8 quantiser: using torch ops (several times slower): {err}", stacklevel=3)
                _kernel = False
        return _kernel or None


def quantize_bf16(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, block: int, fp8_max: float,
                  min_scale: float, pow2: bool, fnuz: bool, deq_factor: float, nan_code: int) -> torch.Tensor:
    """x [rows, cols] bf16 -> q [rows, cols] (1-byte), scale [gb, nb] fp32, all CPU with unit column stride
    (q may share x's memory, see the C source); returns the figures, float64 [6]."""
    fn = kernel()
    if fn is None:
        raise RuntimeError("the compiled FP8 quantiser is not available")
    if not (x.stride(-1) == q.stride(-1) == scale.stride(-1) == 1 and x.dtype == torch.bfloat16):
        raise ValueError("quantize_bf16 needs bf16 input and rows of unit stride")
    rows, cols = x.shape
    figures = torch.zeros(FIGURES, dtype=torch.float64)
    if fn(x.data_ptr(), x.stride(0), q.data_ptr(), q.stride(0), rows, cols, scale.data_ptr(), scale.stride(0),
          scale.shape[0], scale.shape[1], block, fp8_max, min_scale, pow2, fnuz, deq_factor, nan_code,
          figures.data_ptr()):
        raise MemoryError("FP8 quantiser: no memory for its row scratch")
    return figures


def cast_f32(y: torch.Tensor, fnuz: bool) -> torch.Tensor:
    """The kernel's fp32 -> fp8 rounding alone (for tests and benchmarks): y float32 CPU -> uint8 bit patterns."""
    if kernel() is None:
        raise RuntimeError("the compiled FP8 quantiser is not available")
    y = y.contiguous()
    out = torch.empty(y.shape, dtype=torch.uint8)
    _library.repro_fp8_cast_f32(y.data_ptr(), out.data_ptr(), y.numel(), fnuz)
    return out
