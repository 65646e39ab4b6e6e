"""The embedded engine's shared batch rows (one prefill per prompt, one row per common history) and dropped
finished rows give each response exactly what a forward of that response alone gives."""

import pytest
import torch
from transformers import DynamicCache

from repro.model.routing import RoutingRecorder
from repro.model.tiny import BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID, build_tiny_model
from repro.rollout.decode_cache import RoutingTable, branch, select_rows
from repro.rollout.embedded import EmbeddedEngine
from repro.rollout.shared_kv_attention import use_shared_kv_attention
from repro.rollout.types import FinishReason, SamplingParams

# 6-token prompts: the CSA (every 4) and HCA (every 8) compressors hold part-filled windows when rows branch
PROMPTS = [[BOS_TOKEN_ID, 5, 10, 15, 4, 8], [BOS_TOKEN_ID, 6, 6, 16, 4, 4]]
# low temperature: the 4 samples of a prompt agree for a few tokens, then branch; two stop at EOS early
PARAMS = SamplingParams(n=4, max_new_tokens=12, temperature=0.06, seed=0)


@pytest.fixture(scope="module")
def engine():
    return EmbeddedEngine(build_tiny_model(seed=0), EOS_TOKEN_ID, PAD_TOKEN_ID, max_context=40)


def test_shared_rows_and_dropped_rows_match_a_forward_of_each_response(engine):
    batch_sizes = []
    forward = engine._forward
    engine._forward = lambda ids, cache: (batch_sizes.append(len(ids)), forward(ids, cache))[1]
    try:
        trajs = engine.generate(PROMPTS, PARAMS).trajectories
    finally:
        del engine._forward
    lengths = [len(t.response_ids) for t in trajs]
    assert lengths == [12, 12, 12, 4, 12, 12, 12, 2]  # the case this test is about: rows 3 and 7 stop early
    assert [t.finish_reason for t in trajs].count(FinishReason.EOS) == 2
    # one prefill row per prompt; 2 rows for 8 responses at the first decode step; at most one row per response
    assert batch_sizes == [2, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6, 6]
    worst = 0.0
    for traj in trajs:
        ids = torch.tensor([traj.prompt_ids + traj.response_ids[:-1]])
        with torch.no_grad(), RoutingRecorder(engine.model) as recorder:
            logits = engine.model(input_ids=ids).logits[0, len(traj.prompt_ids) - 1 :]
        routing = {layer: table[0] for layer, table in recorder.indices().items()}
        assert sorted(routing) == sorted(traj.routing) == [1, 2, 3]
        assert all(torch.equal(routing[k], traj.routing[k]) for k in routing), (traj.prompt_index, traj.sample_index)
        full = torch.log_softmax(logits / PARAMS.temperature, dim=-1)
        full = full.gather(-1, torch.tensor(traj.response_ids)[:, None]).squeeze(-1)
        worst = max(worst, float((full - traj.logprobs).abs().max()))
    # log-probs of logits / T: a float32 rounding difference in the logits (batch of 1 vs the decode batch) is
    # multiplied by 1/T = 16.7 here, so the bound is 1e-6 in logit units
    assert worst * PARAMS.temperature <= 1e-6, worst


def test_branch_groups_equal_histories():
    node, token = torch.tensor([0, 0, 0, 1, 1, 2]), torch.tensor([7, 3, 7, 5, 5, 1])
    parent, fed, new_node = branch(node, token, vocab=10)
    assert parent.tolist() == [0, 0, 1, 2] and fed.tolist() == [3, 7, 5, 1]
    assert new_node.tolist() == [1, 0, 1, 2, 2, 3]


def _row_states(cache) -> list[torch.Tensor]:
    """Every per-row tensor of a DeepSeek-V4 cache: sliding K=V, compressor/indexer buffers, entries, overlap."""
    states = []
    for layer in cache.layers:
        states.append(layer.keys)
        for state in ("buffer_kv", "buffer_gate", "compressed_kv", "overlap_kv", "overlap_gate"):
            states += [t for _, t in sorted(getattr(layer, state, {}).items()) if t is not None]
    return states


def test_select_rows_moves_every_deepseek_v4_cache_state():
    """Rows [1, 1, 0] of a prefilled cache: every per-row state is those rows of the old one, bit for bit."""
    model = build_tiny_model(seed=0)
    ids = torch.tensor([[BOS_TOKEN_ID, 5, 10, 15, 4, 8, 9], [BOS_TOKEN_ID, 6, 6, 16, 4, 4, 9]])
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids, cache=cache, use_cache=True)
    before = [t.clone() for t in _row_states(cache)]
    assert len(before) == 4 + 2 * 5 * 2 + 3  # 4 K=V; 2 CSA layers x 5 states x (compressor, indexer); HCA: 3
    select_rows(cache, torch.tensor([1, 1, 0]), batch=2)
    after = _row_states(cache)
    assert len(after) == len(before)
    assert all(torch.equal(a, b[[1, 1, 0]]) for a, b in zip(after, before))
    select_rows(cache, torch.arange(3), batch=3)  # keeps every row: no copy
    assert all(a is b for a, b in zip(_row_states(cache), after))


def test_routing_table_puts_each_forward_back_per_response():
    table = RoutingTable(rows=3, positions=3)
    table.add({1: torch.tensor([[[0, 1], [2, 3]]])}, torch.tensor([0, 1, 2]), torch.tensor([0, 0, 0]), 0)
    table.add({1: torch.tensor([[[4, 5]], [[6, 7]]])}, torch.tensor([0, 2]), torch.tensor([1, 0]), 2)
    assert table.tables[1].tolist() == [[[0, 1], [2, 3], [6, 7]], [[0, 1], [2, 3], [-1, -1]],
                                        [[0, 1], [2, 3], [4, 5]]]


def test_shared_kv_attention_is_eager_attention():
    """The engine's attention backend gives eager's logits on a full forward of the tiny model (bit for bit
    here; the contract is float32 rounding, 1e-6)."""
    eager = build_tiny_model(seed=0)
    shared = build_tiny_model(seed=0)
    assert use_shared_kv_attention(shared) and eager.config._attn_implementation == "eager"
    ids = torch.randint(3, 25, (3, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (eager(input_ids=ids).logits - shared(input_ids=ids).logits).abs().max() <= 1e-6


def test_shared_kv_attention_is_left_off_outside_float32():
    """Eager's max subtraction rounds in BF16, so a BF16 model keeps eager attention (its logits would differ)."""
    model = build_tiny_model(seed=0).to(torch.bfloat16)
    assert not use_shared_kv_attention(model) and model.config._attn_implementation == "eager"
