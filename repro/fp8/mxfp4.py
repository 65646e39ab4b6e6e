"""The official DeepSeek-V4 release's other two encodings, as pure tensor functions: E8M0 scales and MXFP4 experts.

E8M0 (``torch.float8_e8m0fnu``, safetensors ``F8_E8M0``) is an exponent byte: value 2^(byte - 127), byte 255 NaN.
The release stores every FP8 weight's 128x128 block scale this way (``<name>.scale``, next to ``<name>.weight``).

MXFP4 (OCP microscaling): each run of 32 values along a row shares one E8M0 scale, and each value is an e2m1
code, 4 bits: sign, 2 exponent bits, 1 mantissa bit, magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}. Two codes share a
byte, the even element in the low nibble (vLLM's ``_dequant_mxfp4_ue8m0_gran32`` reads them so). The release
stores routed experts this way: ``experts.E.wN.weight`` [N, K/2] bytes, ``experts.E.wN.scale`` [N, K/32] E8M0.
Its FP4 kernels in vLLM target gfx950 (MI350) and NVIDIA; gfx942 (MI300/MI308X) has none.
"""

from __future__ import annotations

import torch

PACKED_FP4 = (torch.float4_e2m1fn_x2, torch.int8, torch.uint8)  # how a checkpoint may hold MXFP4 bytes

MXFP4_BLOCK = 32
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_MAX_EXPONENT = 2  # 6 = 1.5 x 2^2
_E8M0_BIAS = 127
_E8M0_NAN = 255


def e8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes (float8_e8m0fnu or uint8) -> float32 powers of two; the NaN byte becomes NaN."""
    byte = scale.view(torch.uint8).to(torch.int32)
    out = torch.ldexp(torch.ones(byte.shape), byte - _E8M0_BIAS)
    return torch.where(byte == _E8M0_NAN, torch.full_like(out, float("nan")), out)


def float_to_e8m0(scale: torch.Tensor) -> torch.Tensor:
    """float32 powers of two in [2^-127, 2^127] -> float8_e8m0fnu, exactly; anything else is refused."""
    mantissa, exponent = torch.frexp(scale.float())
    if not bool(((mantissa == 0.5) & (exponent - 1 >= -_E8M0_BIAS) & (exponent - 1 <= _E8M0_BIAS)).all()):
        raise ValueError("E8M0 holds only powers of two in [2^-127, 2^127]")
    return (exponent - 1 + _E8M0_BIAS).to(torch.uint8).view(torch.float8_e8m0fnu)


def double_scale(scale: torch.Tensor) -> torch.Tensor:
    """``scale`` x 2 in its own dtype: float scales multiply, E8M0 scales add one to the exponent byte."""
    if scale.dtype == torch.float8_e8m0fnu:
        byte = scale.view(torch.uint8).to(torch.int32)
        if bool((byte >= _E8M0_NAN - 1).any()):
            raise ValueError("an E8M0 scale is 2^127 or NaN: doubling it leaves E8M0's range")
        return (byte + 1).to(torch.uint8).view(torch.float8_e8m0fnu)
    return scale * 2.0


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] (K a multiple of 32) -> (packed uint8 [N, K/2], scale float8_e8m0fnu [N, K/32]).

    Each block's scale is 2^(floor(log2 amax) - 2), the OCP choice that puts the block's largest value in e2m1's
    top binade (values past 6 x scale are clamped to 6); each value goes to the nearest e2m1 magnitude, ties to
    the even code. An all-zero block gets scale 1.
    """
    if w.ndim != 2 or w.shape[1] % MXFP4_BLOCK:
        raise ValueError(f"MXFP4 needs a [N, K] tensor with K a multiple of {MXFP4_BLOCK}, got {tuple(w.shape)}")
    n, k = w.shape
    blocks = w.float().reshape(n, k // MXFP4_BLOCK, MXFP4_BLOCK)
    amax = blocks.abs().amax(dim=-1)
    if not bool(torch.isfinite(amax).all()):
        raise ValueError("MXFP4 input holds NaN or Inf")
    _, exponent = torch.frexp(torch.where(amax > 0, amax, torch.ones_like(amax)))
    shared = torch.where(amax > 0, exponent - 1 - _E2M1_MAX_EXPONENT, torch.zeros_like(exponent))
    scale = torch.ldexp(torch.ones_like(amax), shared)
    scaled = (blocks / scale[..., None]).clamp(-6.0, 6.0)
    table = torch.tensor(E2M1_MAGNITUDES)
    distance = (scaled.abs()[..., None] - table).abs()
    # nearest magnitude; on a tie argmin takes the first (lower) code, which is the even one except between
    # 1.5/2 and 3/4, where the upper code (4, 6) is the even one
    code = distance.argmin(dim=-1)
    tie_up = (distance.gather(-1, (code + 1).clamp(max=7)[..., None]).squeeze(-1) == distance.gather(
        -1, code[..., None]).squeeze(-1)) & (code % 2 == 1)
    code = (code + tie_up.long()).clamp(max=7)
    code = code | ((scaled < 0) & (code > 0)).long() << 3
    flat = code.reshape(n, k).to(torch.uint8)
    packed = flat[:, 0::2] | (flat[:, 1::2] << 4)
    return packed.contiguous(), float_to_e8m0(scale)


def dequantize_mxfp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """packed [N, K/2] (uint8, int8 or float4_e2m1fn_x2 bytes), scale [N, K/32] (E8M0) -> float32 [N, K]."""
    raw = packed.view(torch.uint8)
    n, half = raw.shape
    if scale.shape != (n, 2 * half // MXFP4_BLOCK):
        raise ValueError(f"MXFP4 scale {tuple(scale.shape)} does not fit packed values {tuple(raw.shape)}")
    table = torch.tensor(E2M1_MAGNITUDES + tuple(-m for m in E2M1_MAGNITUDES))
    values = torch.empty(n, 2 * half)
    values[:, 0::2] = table[(raw & 0x0F).long()]
    values[:, 1::2] = table[(raw >> 4).long()]
    return values * e8m0_to_float(scale).repeat_interleave(MXFP4_BLOCK, dim=-1)
