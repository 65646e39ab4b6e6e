"""Block-wise FP8 for the rollout side: BF16 weights -> e4m3fn / e4m3fnuz with 128×128 fp32 block scales.

Modules, in reading order:
- quant.py   pure tensor functions: quantise/dequantise a [..., N, K] tensor, formats, vLLM's fn->fnuz rule
- mxfp4.py   the official DeepSeek-V4 release's E8M0 scales and MXFP4 experts, as pure tensor functions
- rules.py   which tensors are quantised and why (`decide`), listable as a table; how scales are named and paired
- stream.py  (name, tensor) iterator in, converted pairs out: shared by checkpoint conversion and weight sync
- verify.py  error bound (derived there), per-tensor stats, tables, histogram, independent checkpoint check
- safetensors_io.py  streaming safetensors reader/writer (F8_E8M0 and packed F4 included)
- inputs.py  input checks before anything is written: config, shards, headers, dtypes, the output plan
- convert.py checkpoint folder -> FP8 folder: shards in parallel, atomic output, resume, report
- official.py  deepseek-ai's FP8 + MXFP4 storage, for tiny test checkpoints

A DeepSeek-V4 is written in the release's names with `.scale` block scales: docs/checkpoint-layouts.md.
"""

from repro.fp8.convert import ConversionResult, ConvertOptions, convert_checkpoint
from repro.fp8.inputs import plan_table
from repro.fp8.quant import FORMATS, dequantize_block, e4m3fn_to_e4m3fnuz, quantize_block
from repro.fp8.rules import decide, decision_table
from repro.fp8.stream import fn_to_fnuz_tensors, quantize_tensors
from repro.fp8.verify import error_histogram, load_tensor, rel_error_bound, stats_table, verify_checkpoint

__all__ = [
    "FORMATS",
    "ConversionResult",
    "ConvertOptions",
    "convert_checkpoint",
    "decide",
    "decision_table",
    "dequantize_block",
    "e4m3fn_to_e4m3fnuz",
    "error_histogram",
    "fn_to_fnuz_tensors",
    "load_tensor",
    "plan_table",
    "quantize_block",
    "quantize_tensors",
    "rel_error_bound",
    "stats_table",
    "verify_checkpoint",
]
