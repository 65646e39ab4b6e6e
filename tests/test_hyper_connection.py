"""Hyper-connection weights entry by entry (repro.model.hyper_connection): exact values on a hand-built matrix,
bit-identical to transformers' module's outputs for the stream counts V4 uses (2 tiny, 4 Flash), and its
gradients too for 2 streams."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DeepseekV4Config
from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection

from repro.model.hyper_connection import (
    EntrywiseHyperConnection, collapse_streams, sinkhorn_entrywise, use_entrywise_hyper_connections,
)
from repro.model.tiny import build_tiny_model


def test_sinkhorn_of_a_hand_built_matrix():
    comb = torch.tensor([[1.0, 3.0], [1.0, 1.0]])
    # one iteration = the column step only: columns (1, 1) / 2 and (3, 1) / 4
    assert sinkhorn_entrywise(comb, iters=1, eps=0.0).tolist() == [[0.5, 0.75], [0.5, 0.25]]
    # then rows (0.5, 0.75) / 1.25 = (0.4, 0.6) and (0.5, 0.25) / 0.75 = (2/3, 1/3), then columns again
    two = sinkhorn_entrywise(comb, iters=2, eps=0.0)
    rows = torch.tensor([[0.4, 0.6], [2 / 3, 1 / 3]])
    torch.testing.assert_close(two, rows / rows.sum(dim=0, keepdim=True), rtol=0, atol=1e-7)
    with pytest.raises(ValueError, match=r"\[\.\.\., N, N\]"):
        sinkhorn_entrywise(torch.ones(3, 2), iters=2, eps=0.0)


def hyper_connection(streams: int, hidden: int = 32, seed: int = 0) -> DeepseekV4HyperConnection:
    config = DeepseekV4Config(hc_mult=streams, hidden_size=hidden, hc_sinkhorn_iters=20)
    module = DeepseekV4HyperConnection(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
    return module


@pytest.mark.parametrize("streams", [2, 4])
@pytest.mark.parametrize("shape", [(64, 18), (8, 1)])  # a trainer batch, a decode step
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_entrywise_module_is_bit_identical_to_the_library_forward_and_backward(streams, shape, dtype):
    library = hyper_connection(streams)
    ours = copy.deepcopy(library)
    ours.__class__ = EntrywiseHyperConnection
    x = torch.randn(*shape, streams, 32, generator=torch.Generator().manual_seed(1)).to(dtype)
    outputs = []
    for module in (library, ours):
        xs = x.clone().requires_grad_()
        post, comb, collapsed = module(xs)
        (post.sum() * 0.3 + (comb * torch.arange(streams * streams).view(streams, streams)).sum()
         + collapsed.float().pow(2).sum()).backward()
        outputs.append([post, comb, collapsed, xs.grad] + [p.grad for p in module.parameters()])
    assert comb.shape == (*shape, streams, streams)
    for index, (mine, theirs) in enumerate(zip(outputs[1], outputs[0])):
        assert mine.dtype == theirs.dtype
        if index < 3 or streams == 2:  # outputs always; gradients too where a sum is one addition
            assert torch.equal(mine, theirs), index
        else:  # four streams: autograd adds the gradients of a 4-term sum in another order (1-2 ulps)
            ulp = torch.finfo(mine.dtype).eps
            torch.testing.assert_close(mine, theirs, rtol=2 * ulp, atol=2 * ulp * float(theirs.abs().max()))


def test_collapse_adds_the_streams_left_to_right():
    pre = torch.tensor([[[0.5, 2.0]]])
    streams = torch.tensor([[[[1.0, 2.0], [3.0, -1.0]]]])
    assert collapse_streams(pre, streams).tolist() == [[[6.5, -1.0]]]


def test_more_streams_than_four_keep_the_library_forward():
    library = hyper_connection(8, hidden=16)
    ours = copy.deepcopy(library)
    ours.__class__ = EntrywiseHyperConnection
    x = torch.randn(4, 3, 8, 16)
    for mine, theirs in zip(ours(x), library(x)):
        assert torch.equal(mine, theirs)


def test_switching_a_model_keeps_its_logits_exactly():
    model = build_tiny_model(seed=0).eval()
    switched = copy.deepcopy(model)
    assert use_entrywise_hyper_connections(switched) == 2 * model.config.num_hidden_layers
    assert use_entrywise_hyper_connections(switched) == 0  # already switched
    ids = torch.randint(3, model.config.vocab_size, (4, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(switched(input_ids=ids).logits, model(input_ids=ids).logits)
