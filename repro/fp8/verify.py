"""How wrong may dequant(FP8) be, and is it? Error bounds, per-tensor statistics, tables and the histogram.

The bound. A block of W is stored as q = RNE_e4m3(W / s) with s >= amax/FP8_MAX, so |W/s| <= FP8_MAX and
nothing is clipped. e4m3 keeps 3 mantissa bits: a normal value y in [2^E, 2^(E+1)) sits on a grid of
spacing 2^(E-3), so round-to-nearest moves it by at most 2^(E-4) <= 2^-4·|y|. Below the smallest normal
(2^-6 for fn, 2^-7 for fnuz) the grid spacing is fixed (`subnormal_step`), and the error is at most half of
it. Multiplying back by s, for every element:

    |deq - w| <= 2^-4·|w| + (subnormal_step/2)·s                                          (1)

Summed over a tensor (Minkowski), with s_b <= k·amax_b/FP8_MAX (k = 1, or 2 for power-of-two scales) and
amax_b² <= ||W_b||² over blocks of at most 128² elements:

    ||deq - W||_F / ||W||_F <= 2^-4 + 128·k·(subnormal_step/2)/FP8_MAX  (= 0.06278 for fn, k = 1)   (2)

and the largest error is at most (2^-4 + k·(subnormal_step/2)/FP8_MAX)·max|W|. Correct code cannot exceed
these, so they are the default failure thresholds; typical weights land near 0.026 (Gaussian-like values).
fp32 rounding in the scale and product adds ~2^-22 relative, covered by `_SLACK`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

from repro.errors import CheckpointError
from repro.fp8.mxfp4 import PACKED_FP4, dequantize_mxfp4, e8m0_to_float
from repro.fp8.quant import MANTISSA_BITS, FP8Format, dequantize_block, get_format
from repro.fp8.rules import pair_scales
from repro.fp8.safetensors_io import read_header
from repro.model import layouts

REL_ROUNDING_BOUND = 2.0 ** -(MANTISSA_BITS + 1)  # 2^-4 = 0.0625: half an ulp relative to the value
_SLACK = 1 + 2**-20


def rel_error_bound(fmt: str | FP8Format = "e4m3fn", pow2_scale: bool = False, block_size: int = 128) -> float:
    """Bound (2) on ||deq - W||_F / ||W||_F for one tensor."""
    f = get_format(fmt)
    k = 2 if pow2_scale else 1
    return (REL_ROUNDING_BOUND + block_size * k * (f.subnormal_step / 2) / f.max) * _SLACK


def max_abs_error_bound(max_abs: float, fmt: str | FP8Format = "e4m3fn", pow2_scale: bool = False) -> float:
    """Bound on max |deq - w| for a tensor whose largest |w| is `max_abs` (from (1))."""
    f = get_format(fmt)
    k = 2 if pow2_scale else 1
    return (REL_ROUNDING_BOUND + k * (f.subnormal_step / 2) / f.max) * max_abs * _SLACK


def element_error_bound(w: torch.Tensor, scale_expanded: torch.Tensor, fmt: str | FP8Format = "e4m3fn") -> torch.Tensor:
    """Bound (1) for every element, given the scale broadcast to w's shape."""
    f = get_format(fmt)
    return (REL_ROUNDING_BOUND * w.abs().float() + (f.subnormal_step / 2) * scale_expanded) * _SLACK


@dataclass
class TensorStats:
    """One row of the conversion report."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # input dtype
    action: str  # "fp8", "keep" or "fn->fnuz"
    reason: str
    numel: int
    bytes_in: int
    bytes_out: int  # FP8 data plus its scale tensor
    rel_error: float = math.nan  # ||deq - w|| / ||w|| (fp8 tensors)
    max_abs_error: float = math.nan
    max_abs: float = math.nan  # max |w|
    shard: str = ""
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shape"] = list(self.shape)
        return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in d.items()}  # JSON has no NaN

    @classmethod
    def from_dict(cls, d: dict) -> "TensorStats":
        d = {k: math.nan if v is None and k in ("rel_error", "max_abs_error", "max_abs") else v for k, v in d.items()}
        return cls(**{**d, "shape": tuple(d["shape"])})


def check_stats(stats: TensorStats, max_rel_error: float, fmt: str | FP8Format, pow2_scale: bool, fp8_nan: int = 0,
                where: str = "") -> None:
    """Raise CheckpointError if a quantised tensor came out NaN, or its error is above the threshold/bound."""
    prefix = f"{where}: " if where else ""
    if fp8_nan or not math.isfinite(stats.rel_error) or not math.isfinite(stats.max_abs_error):
        raise CheckpointError(f"{prefix}tensor {stats.name}: FP8 result holds NaN/Inf")
    if stats.rel_error > max_rel_error:
        raise CheckpointError(
            f"{prefix}tensor {stats.name}: relative error {stats.rel_error:.4g} above the threshold {max_rel_error:.4g}"
        )
    bound = max_abs_error_bound(stats.max_abs, fmt, pow2_scale)
    if stats.max_abs_error > bound:
        raise CheckpointError(
            f"{prefix}tensor {stats.name}: max abs error {stats.max_abs_error:.4g} above the bound {bound:.4g}"
        )


def stats_table(stats: list[TensorStats]):
    """The per-tensor report as a DataFrame, one row per input tensor."""
    import pandas as pd

    cols = ["name", "shard", "shape", "dtype", "action", "reason", "numel", "bytes_in", "bytes_out",
            "rel_error", "max_abs_error", "max_abs"]
    return pd.DataFrame([{c: getattr(s, c) for c in cols} for s in stats], columns=cols)


def summarise(stats: list[TensorStats]) -> dict:
    """Headline numbers of a conversion's per-tensor stats (JSON-friendly). Plain Python: the converter calls it
    on its clock, and importing pandas for a DataFrame would take ~0.4 s of it."""
    fp8 = [s for s in stats if s.action == "fp8"]
    bytes_in, bytes_out = sum(s.bytes_in for s in stats), sum(s.bytes_out for s in stats)
    errors = sorted(s.rel_error for s in fp8)
    median = (errors[(len(errors) - 1) // 2] + errors[len(errors) // 2]) / 2 if errors else 0.0
    return {
        "tensors": len(stats),
        "tensors_fp8": len(fp8),
        "tensors_kept": sum(s.action == "keep" for s in stats),
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
        "size_ratio": bytes_out / max(bytes_in, 1),
        "params_fp8_fraction": sum(s.numel for s in fp8) / max(sum(s.numel for s in stats), 1),
        "rel_error_max": float(max(errors, default=0.0)),
        "rel_error_median": float(median),
        "max_abs_error": float(max((s.max_abs_error for s in fp8), default=0.0)),
    }


def error_histogram(table, *, fmt: str = "e4m3fn", pow2_scale: bool = False, title: str = ""):
    """Histogram of per-tensor relative error of the FP8 tensors, with the theoretical bound (2) marked.

    Built with matplotlib's object API (no pyplot, no global backend change); `fig.savefig` renders with Agg.
    """
    from matplotlib.figure import Figure

    fp8 = table[table.action == "fp8"]
    fig = Figure(figsize=(6, 3.2), layout="constrained")
    ax = fig.subplots()
    ax.hist(fp8.rel_error, bins=min(40, max(5, len(fp8) // 2)), color="#4c72b0")
    bound = rel_error_bound(fmt, pow2_scale)
    ax.axvline(bound, color="#c44e52", linestyle="--", label=f"bound {bound:.4f}")
    ax.set_xlabel("relative error ||deq - w|| / ||w|| per tensor")
    ax.set_ylabel("tensors")
    ax.set_title(title or f"{len(fp8)} FP8 tensors ({fmt}{', pow2 scales' if pow2_scale else ''})")
    ax.legend()
    return fig


def _locate(folder) -> dict:
    """tensor name -> shard path, from the index or by opening every shard."""
    import json
    from pathlib import Path

    from safetensors import safe_open

    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        return {n: folder / f for n, f in json.loads(index.read_text())["weight_map"].items()}
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            out.update({n: path for n in f.keys()})
    return out


def load_tensor(folder, name: str, _where: dict | None = None) -> torch.Tensor:
    """One tensor of a checkpoint folder, read with the `safetensors` library."""
    from safetensors import safe_open

    where = _where if _where is not None else _locate(folder)
    with safe_open(where[name], "pt") as f:
        return f.get_tensor(name)


def verify_checkpoint(reference_dir, fp8_dir, block_size: int = 128):
    """Independent check of a converted folder, read with the `safetensors` library (as loaders do).

    For every tensor of the reference (BF16) checkpoint, under the name the output gives it (a DeepSeek-V4
    reference in transformers' layout is compared in the release's names, its stacked experts cut per expert):
    the output either holds it unchanged (bit for bit) or holds low-precision data plus its block scale, whatever
    the scale's naming (`_scale_inv`, `.scale`) or encoding (FP32, E8M0), whose reference dequantisation is
    compared with the original. MXFP4 experts (the official release's) are dequantised too.
    Returns a DataFrame: name, action ("fp8"/"fp4"/"keep"), dtype, rel_error, max_abs_error, finite, identical.
    """
    import pandas as pd

    ref, out = _locate(reference_dir), _locate(fp8_dir)
    scale_of = {w: sc for sc, w in pair_scales(_dtypes(fp8_dir, out)).items()}
    rows, seen = [], set()
    for name, w in _reference_items(reference_dir, ref, out):
        seen.add(name)
        if name not in out:
            raise CheckpointError(f"{fp8_dir}: reference tensor {name} is missing")
        got = load_tensor(fp8_dir, name, out)
        row = {"name": name, "dtype": str(got.dtype).removeprefix("torch.")}
        if name in scale_of:
            scale = load_tensor(fp8_dir, scale_of[name], out)
            if got.dtype in PACKED_FP4:
                deq, action = dequantize_mxfp4(got, scale), "fp4"
            else:
                scale = e8m0_to_float(scale) if scale.dtype == torch.float8_e8m0fnu else scale
                deq, action = dequantize_block(got, scale, block_size=block_size), "fp8"
            d = deq - w.float()
            norm = w.float().norm().item()
            row |= {"action": action, "rel_error": d.norm().item() / norm if norm else d.norm().item(),
                    "max_abs_error": d.abs().max().item() if d.numel() else 0.0,
                    "finite": bool(torch.isfinite(deq).all()), "identical": False}
        else:
            same = got.dtype == w.dtype and got.shape == w.shape and torch.equal(
                got.reshape(-1).view(torch.uint8), w.reshape(-1).view(torch.uint8))
            row |= {"action": "keep", "rel_error": 0.0 if same else math.nan,
                    "max_abs_error": 0.0 if same else math.nan, "finite": True, "identical": same}
        rows.append(row)
    extra = set(out) - seen - {scale_of[n] for n in seen if n in scale_of}
    if extra:
        raise CheckpointError(f"{fp8_dir}: tensors not in the reference: {sorted(extra)[:5]}")
    return pd.DataFrame(rows, columns=["name", "action", "dtype", "rel_error", "max_abs_error", "finite", "identical"])


def _dtypes(folder, where: dict) -> dict[str, torch.dtype]:
    dtypes = {}
    for path in sorted(set(where.values())):
        dtypes.update({t.name: t.dtype for t in read_header(path)[0]})
    return dtypes


def _reference_items(reference_dir, ref: dict, out: dict):
    """(output name, reference tensor): a DeepSeek-V4 in-memory-layout reference cut into release tensors when
    the output is in the release's names, any other reference under its own names."""
    cut = False
    if any(n.startswith("model.layers.") for n in ref) and any(n.startswith("layers.") for n in out):
        cut = layouts.detect_layout(ref, where=str(reference_dir)) == layouts.HF
    for name in sorted(ref):
        tensor = load_tensor(reference_dir, name, ref)
        if not cut:
            yield name, tensor
            continue
        for part in layouts.release_parts(name, tuple(tensor.shape)):
            yield part.name, part.select(tensor)
