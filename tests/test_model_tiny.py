"""The tiny DeepSeek-V4: size, every attention kind compressing at tiny-math lengths, hash table, cached decoding."""

import pytest
import torch

from repro.data.tinymath import train_problems
from repro.model.tiny import TINY_CONFIG, build_tiny_model, parameter_count, tiny_config
from repro.model.tokenizer import build_tiny_tokenizer
from repro.model.warmstart import sft_batch


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(seed=0)


@pytest.fixture(scope="module")
def task_batch():
    """8 real tiny-math sequences (BOS + prompt + response + EOS, 17-19 tokens, right-padded)."""
    return sft_batch(train_problems(seed=3)[:8], build_tiny_tokenizer())[0]


def test_parameter_count_is_about_two_million(model):
    assert 2_000_000 <= parameter_count(model) <= 3_000_000


def test_config_constant_is_what_the_model_uses(model):
    assert model.config.hidden_size == TINY_CONFIG["hidden_size"]
    assert model.config.layer_types == TINY_CONFIG["layer_types"]
    assert set(model.config.layer_types) == \
        {"sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"}
    assert model.config.mlp_layer_types[0] == "hash_moe" and set(model.config.mlp_layer_types[1:]) == {"moe"}
    assert model.config.hc_mult == 2 and model.config._attn_implementation == "eager"


def test_hash_table_gives_each_token_distinct_experts(model):
    table = model.model.layers[0].mlp.gate.tid2eid
    assert table.shape == (TINY_CONFIG["vocab_size"], TINY_CONFIG["num_experts_per_tok"])
    assert (table[:, 0] != table[:, 1]).all()
    assert len(set(table.flatten().tolist())) == TINY_CONFIG["n_routed_experts"]  # every expert is used


def test_build_is_deterministic_in_seed():
    a, b, c = build_tiny_model(seed=5), build_tiny_model(seed=5), build_tiny_model(seed=6)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


@torch.no_grad()
def test_cached_decoding_equals_full_forward_and_every_compressor_emits(model, task_batch):
    full = model(task_batch).logits
    prompt_len = 7  # BOS + "37+05="
    out = model(task_batch[:, :prompt_len], use_cache=True)
    cache, steps = out.cache, [out.logits]
    for t in range(prompt_len, task_batch.shape[1]):
        out = model(task_batch[:, t : t + 1], cache=cache, use_cache=True)
        cache, steps = out.cache, steps + [out.logits]
    assert (torch.cat(steps, dim=1) - full).abs().max().item() <= 1e-4
    for i, kind in enumerate(model.config.layer_types):
        if kind != "sliding_attention":  # CSA (rate 4) and HCA (rate 8) both closed windows at these lengths
            assert cache.layers[i].entry_count["compressor"] >= 2, (i, kind)


def test_overrides_reach_the_config():
    assert tiny_config(num_hidden_layers=2, layer_types=TINY_CONFIG["layer_types"][:2],
                       mlp_layer_types=TINY_CONFIG["mlp_layer_types"][:2]).num_hidden_layers == 2
