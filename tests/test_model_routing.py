"""Routing record / replay (R3): own routing replays bit-identically with live router gradients; other experts
change the logits; cached decoding records the same routing as a full forward."""

import pytest
import torch

from repro.data.tinymath import train_problems
from repro.model.routing import RoutingError, RoutingRecorder, RoutingReplay, topk_routers
from repro.model.tiny import build_tiny_model
from repro.model.tokenizer import build_tiny_tokenizer
from repro.model.warmstart import sft_batch

PROMPT_LEN = 7


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(seed=2)


@pytest.fixture(scope="module")
def ids():
    return sft_batch(train_problems(seed=4)[:6], build_tiny_tokenizer())[0]


@pytest.fixture(scope="module")
def recorded(model, ids):
    with torch.no_grad(), RoutingRecorder(model) as recorder:
        logits = model(ids).logits
    return logits, recorder.indices()


def test_records_every_topk_layer_and_no_hash_layer(model, ids, recorded):
    _, indices = recorded
    hash_layers = [i for i, t in enumerate(model.config.mlp_layer_types) if t == "hash_moe"]
    assert sorted(indices) == sorted(topk_routers(model)) and not set(hash_layers) & set(indices)
    for tensor in indices.values():
        assert tensor.shape == (*ids.shape, model.config.num_experts_per_tok) and tensor.dtype == torch.int64
        assert (tensor[..., 0] != tensor[..., 1]).all()


def test_replaying_own_routing_is_bit_identical_and_router_gets_gradients(model, ids, recorded):
    logits, indices = recorded
    model.zero_grad(set_to_none=True)
    with RoutingReplay(model, indices):
        replayed = model(ids).logits
    assert torch.equal(replayed, logits)
    replayed.logsumexp(-1).sum().backward()
    for layer, router in topk_routers(model).items():
        assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0, layer
    model.zero_grad(set_to_none=True)


def test_forcing_other_experts_changes_logits(model, ids, recorded):
    logits, indices = recorded
    shifted = {layer: (idx + 1) % model.config.n_routed_experts for layer, idx in indices.items()}
    with torch.no_grad(), RoutingReplay(model, shifted):
        forced = model(ids).logits
    assert (forced - logits).abs().max() > 1e-3


def test_hooks_are_removed_on_exit(model, ids, recorded):
    logits, indices = recorded
    shifted = {layer: (idx + 3) % model.config.n_routed_experts for layer, idx in indices.items()}
    with torch.no_grad(), RoutingReplay(model, shifted):
        model(ids)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, logits)
    assert all(not r._forward_hooks for r in topk_routers(model).values())


def test_cached_decoding_records_the_full_forward_routing_and_replays_stepwise(model, ids, recorded):
    _, indices = recorded
    with torch.no_grad(), RoutingRecorder(model) as recorder:
        out = model(ids[:, :PROMPT_LEN], use_cache=True)
        steps = [out.logits]
        for t in range(PROMPT_LEN, ids.shape[1]):
            out = model(ids[:, t : t + 1], cache=out.cache, use_cache=True)
            steps.append(out.logits)
    for layer, tensor in recorder.indices().items():
        assert torch.equal(tensor, indices[layer]), layer
    with torch.no_grad(), RoutingReplay(model, recorder.indices()):
        out = model(ids[:, :PROMPT_LEN], use_cache=True)
        replayed = [out.logits]
        for t in range(PROMPT_LEN, ids.shape[1]):
            out = model(ids[:, t : t + 1], cache=out.cache, use_cache=True)
            replayed.append(out.logits)
    assert torch.equal(torch.cat(replayed, 1), torch.cat(steps, 1))


def test_bad_replay_indices_are_named(model, ids, recorded):
    _, indices = recorded
    with pytest.raises(RoutingError, match="lack top-k MoE layers"):
        RoutingReplay(model, {})
    with pytest.raises(RoutingError, match=r"\[0, 8\)"):
        RoutingReplay(model, {k: v + 8 for k, v in indices.items()})
    short = {k: v[:, :5] for k, v in indices.items()}
    with pytest.raises(RoutingError, match="positions"), torch.no_grad(), RoutingReplay(model, short):
        model(ids)
