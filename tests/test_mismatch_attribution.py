"""repro.model.indexer_choices and repro.studies.mismatch_attribution: the indexer's record and replay on a
tiny DeepSeek-V4, the disagreement counts by hand, the position shares and the growth ratio."""

import math

import pytest
import torch

from repro.studies import mismatch_attribution as ma
from repro.model.indexer_choices import IndexerChoices, IndexerError, choice_disagreement, indexers
from repro.model.tiny import build_tiny_model


def test_choice_disagreement_ignores_order_and_invalid_picks():
    a = torch.tensor([[[3, 1, -1], [0, 2, 1]]])
    b = torch.tensor([[[1, 3, -1], [0, 2, 4]]])
    differs, swapped = choice_disagreement(a, b)
    assert differs.tolist() == [[False, True]]
    assert swapped.tolist() == [[0, 1]]  # a's pick 1 is not among b's at position 1
    with pytest.raises(IndexerError, match=r"\(1, 2, 3\) vs \(1, 2, 2\)"):
        choice_disagreement(a, b[..., :2])


def test_indexer_replay_forces_another_models_choices():
    # index_topk 2 of up to 8 compressed entries: the indexer really chooses at 32 tokens
    a, b = build_tiny_model(0, index_topk=2), build_tiny_model(1, index_topk=2)
    ids = torch.randint(3, 20, (1, 32), generator=torch.Generator().manual_seed(0))
    assert sorted(indexers(a)) == [1, 3]  # the two compressed-sparse-attention layers
    with torch.no_grad(), IndexerChoices(a) as rec_a:
        logits_a = a(input_ids=ids, use_cache=False).logits
    with torch.no_grad(), IndexerChoices(a, replay=rec_a.choices):
        assert torch.equal(a(input_ids=ids, use_cache=False).logits, logits_a)  # own choices: bit for bit
    with torch.no_grad(), IndexerChoices(b) as rec_b:
        logits_b = b(input_ids=ids, use_cache=False).logits
    differs = torch.stack([choice_disagreement(rec_a.choices[k], rec_b.choices[k])[0] for k in (1, 3)])
    assert differs.any()
    with torch.no_grad(), IndexerChoices(b, replay=rec_a.choices):
        forced = b(input_ids=ids, use_cache=False).logits
    assert not torch.equal(forced, logits_b)
    with pytest.raises(IndexerError, match="layer 1"), torch.no_grad(), IndexerChoices(b, replay=rec_a.choices):
        b(input_ids=ids[:, :16], use_cache=False)
    with pytest.raises(IndexerError, match=r"lack CSA layers \[3\]"):
        IndexerChoices(b, replay={1: rec_a.choices[1]})


def test_share_by_bucket_counts_valid_positions_over_layers():
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    layer0 = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 1]], dtype=torch.bool)  # masked columns must not count
    layer1 = torch.zeros(2, 4, dtype=torch.bool)
    rows = ma.share_by_bucket([layer0, layer1], mask, (2, 4))
    # positions 0-1: (row 0 cols 1, 2) + (row 1 cols 0, 1) -> layer0 1, 0, 0, 1 -> 2 of 8 with layer1
    assert rows == [{"start": 0, "end": 2, "share": 2 / 8}, {"start": 2, "end": 4, "share": 1 / 2}]
    assert ma.response_positions(mask).tolist() == [[-1, 0, 1, 2], [0, 1, -1, -1]]


def test_growth_is_token_weighted_late_over_early():
    rows = [{"config": "x", "start": 0, "end": 32, "tokens": 10, "k3": 1.0},
            {"config": "x", "start": 32, "end": 64, "tokens": 10, "k3": 50.0},  # neither early nor late
            {"config": "x", "start": 128, "end": 160, "tokens": 30, "k3": 2.0},
            {"config": "x", "start": 160, "end": 192, "tokens": 10, "k3": 6.0}]
    assert ma.growth(rows) == {"x": {"early": 1.0, "late": 3.0, "ratio": 3.0}}


def test_position_table_weights_seeds_by_tokens():
    rows = [{"config": "b", "seed": 0, "start": 0, "tokens": 1, "k3": 1.0},
            {"config": "b", "seed": 1, "start": 0, "tokens": 3, "k3": 5.0},
            {"config": "a", "seed": 0, "start": 32, "tokens": 2, "k3": 7.0}]
    table = ma.position_table(rows, "k3")
    assert list(table.index) == ["b", "a"] and list(table.columns) == [0, 32]
    assert table.loc["b", 0] == 4.0 and table.loc["a", 32] == 7.0


def test_figures_draw_one_bar_per_run_and_bucket_and_one_line_per_row():
    import pandas as pd

    from repro.analysis.mismatch_plots import plot_attribution, plot_kl_by_position

    table = pd.DataFrame({"k3_kl": [1e-3, 2e-3]}, index=["0–127", "128–511"])
    rows = [{"config": c, "seed": 0, "start": s, "tokens": 4, "k3": 1e-4 * (s + 1), "indexer_disagree": 0.1,
             "routing_flip": 0.02} for c in ("all on (the run)", "weights only") for s in (0, 32)]
    fig = plot_kl_by_position({"a": table, "b": table.iloc[:1]}, rows)
    runs, fine = fig.axes
    heights = [p.get_height() for p in runs.patches]
    assert heights[:3] == [0.001, 0.002, 0.001] and math.isnan(heights[3])  # b lacks 128-511: no bar
    assert [line.get_label() for line in fine.get_lines()] == ["all on (the run)", "weights only"]
    k3, shares = plot_attribution(rows).axes
    assert len(k3.get_lines()) == 2 and len(shares.get_lines()) == 2
