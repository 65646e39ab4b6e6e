"""DeepSeek-V4 HF <-> Megatron weight names on the tiny checkpoint: every tensor covered, both directions agree,
tensors survive the round trip bit for bit. No megatron needed."""

from __future__ import annotations

import pytest
import torch

from repro.model.tiny import build_tiny_model
from repro.train.megatron.dsv4_names import (
    NameMappingError,
    hf_state_to_megatron,
    hf_to_megatron,
    megatron_state_to_hf,
    megatron_to_hf,
)


@pytest.fixture(scope="module")
def tiny_state():
    model = build_tiny_model(seed=0)
    return model.state_dict(), model.config


def test_every_tiny_tensor_has_a_megatron_name_and_maps_back(tiny_state):
    state, config = tiny_state
    experts = config.n_routed_experts
    all_megatron: list[str] = []
    for name in state:
        targets = hf_to_megatron(name, experts)
        assert targets, name
        for target in targets:
            assert name in megatron_to_hf(target), (name, target)
        all_megatron += targets
    # the fused shared fc1 is the only target two HF tensors share
    shared = [n for n in set(all_megatron) if all_megatron.count(n) > 1]
    assert shared and all(n.endswith("mlp.shared_experts.linear_fc1.weight") for n in shared)
    back = {hf for meg in set(all_megatron) for hf in megatron_to_hf(meg)}
    assert back == set(state)


def test_state_round_trip_is_bit_exact(tiny_state):
    state, config = tiny_state
    megatron = hf_state_to_megatron(state)
    layer = 1
    fc1 = megatron[f"decoder.layers.{layer}.mlp.experts.linear_fc1.weight3"]
    assert torch.equal(fc1, state[f"model.layers.{layer}.mlp.experts.gate_up_proj"][3])
    assert fc1.shape == (2 * config.moe_intermediate_size, config.hidden_size)
    shared = megatron[f"decoder.layers.{layer}.mlp.shared_experts.linear_fc1.weight"]
    assert torch.equal(shared[: shared.shape[0] // 2],
                       state[f"model.layers.{layer}.mlp.shared_experts.gate_proj.weight"])
    assert megatron["decoder.layers.0.mlp.router.tid2eid"].dtype == torch.int64
    assert "decoder.layers.1.self_attention.indexer.linear_weights_proj.weight" in megatron
    back = megatron_state_to_hf(megatron)
    assert back.keys() == state.keys()
    for name, tensor in state.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name


def test_unknown_and_incomplete_names_fail_naming_them(tiny_state):
    state, _ = tiny_state
    with pytest.raises(NameMappingError, match="model.layers.0.mlp.mystery.weight"):
        hf_to_megatron("model.layers.0.mlp.mystery.weight", 8)
    with pytest.raises(NameMappingError, match="decoder.layers.0.mlp.linear_fc1.weight"):
        megatron_to_hf("decoder.layers.0.mlp.linear_fc1.weight")
    no_up = {k: v for k, v in state.items() if k != "model.layers.1.mlp.shared_experts.up_proj.weight"}
    with pytest.raises(NameMappingError, match="up_proj"):
        hf_state_to_megatron(no_up)
    megatron = hf_state_to_megatron(state)
    del megatron["decoder.layers.2.mlp.experts.linear_fc2.weight5"]
    with pytest.raises(NameMappingError, match=r"model.layers.2.mlp.experts.down_proj.*\[5\]"):
        megatron_state_to_hf(megatron)


def test_lumenrl_norm_aliases_and_the_release_export(tiny_state):
    """LumenRL's spec names each attention norm twice (``q_norm._norm.weight``); a release folder exports release
    names; a release-named state dict goes in as well."""
    from repro.model import layouts
    from repro.train.megatron.dsv4_names import NORM_ALIASES, megatron_state_to_release

    state, _ = tiny_state
    megatron = hf_state_to_megatron(state, norm_aliases=True)
    q_alias, kv_alias = ("decoder.layers.2.self_attention.q_norm._norm.weight",
                         "decoder.layers.2.self_attention.kv_norm._norm.weight")
    assert torch.equal(megatron[q_alias], state["model.layers.2.self_attn.q_a_norm.weight"])
    assert megatron_to_hf(kv_alias) == ["model.layers.2.self_attn.kv_norm.weight"]
    assert len(megatron) == len(hf_state_to_megatron(state)) + len(NORM_ALIASES) * 4  # two aliases per layer
    back = megatron_state_to_hf(megatron)
    assert back.keys() == state.keys() and all(torch.equal(back[n], state[n]) for n in state)
    release = megatron_state_to_release(megatron)
    expected = layouts.to_release(state)
    assert release.keys() == expected.keys() and all(torch.equal(release[n], expected[n]) for n in expected)
    assert hf_state_to_megatron(expected).keys() == hf_state_to_megatron(state).keys()
    megatron[q_alias] = megatron[q_alias] + 1
    with pytest.raises(NameMappingError, match=r"q_norm._norm.weight: differs from the tensor it aliases"):
        megatron_state_to_hf(megatron)


def test_the_weight_streams_export_units_name_the_whole_state(tiny_state):
    """The Megatron weight stream calls ``export_names`` once per export unit, never on a whole stage: unit by unit
    (experts of a layer and projection together, a layer's other tensors with their norm aliases) the HF and
    release exports are those of the whole state, each tensor once."""
    from repro.train.megatron.dsv4_names import megatron_state_to_release
    from repro.train.megatron.stream_weights import stream_order

    state, _ = tiny_state
    megatron = hf_state_to_megatron(state, norm_aliases=True)
    units = stream_order(list(megatron), grouped=True)
    assert max(len(u) for u in units) < len(megatron) // 4  # no unit is a large part of the model
    for export in (megatron_state_to_hf, megatron_state_to_release):
        whole = export(megatron)
        streamed = [item for unit in units for item in export({n: megatron[n] for n in unit}).items()]
        assert sorted(n for n, _ in streamed) == sorted(whole)  # each name once: no alias sent twice
        assert all(torch.equal(t, whole[n]) for n, t in streamed)
