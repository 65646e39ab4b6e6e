"""Notebook 15 and repro.studies.mismatch_sources: the position buckets against LumenRL's, the tables, and the
notebook's recorded numbers against the library's on a small batch."""

import json
import sys
from pathlib import Path

import pytest
import torch

from repro.algos.metrics import position_metrics
from repro.studies import mismatch_attribution as ma
from repro.studies import mismatch_faults as mf
from repro.studies import mismatch_sources as ms
from repro.metric_keys import POSITION_BUCKET_EDGES, position_key
from repro.notebooks import CHAIN, NOTEBOOKS_DIR, declared_parameters, execute_notebook, notebook_parameters

NAME = "15_mismatch_sources"


def test_bucket_stats_on_hand_built_rows():
    # two rows; row 1's response starts one column later (a longer prompt); positions count valid tokens only
    mask = torch.tensor([[0, 1, 1, 1, 1], [0, 0, 1, 1, 0]], dtype=torch.bool)
    old = torch.zeros(2, 5)
    roll = torch.tensor([[9.0, 0.1, -0.2, 0.3, 0.4], [9.0, 9.0, 0.5, -0.5, 9.0]])
    rows = ms.bucket_stats(old, roll, mask, (2, 4))
    assert [(r["start"], r["end"], r["tokens"]) for r in rows] == [(0, 2, 4), (2, 4, 2)]
    assert rows[0]["k1"] == pytest.approx((0.1 - 0.2 + 0.5 - 0.5) / 4)
    assert rows[0]["abs_diff"] == pytest.approx((0.1 + 0.2 + 0.5 + 0.5) / 4)
    assert rows[1]["k1"] == pytest.approx(0.35)
    k3 = [torch.exp(torch.tensor(-d, dtype=torch.float64)) + d - 1 for d in (0.3, 0.4)]
    assert rows[1]["k3"] == pytest.approx(float(sum(k3) / 2))


def test_bucket_stats_on_lumenrl_edges_equal_position_metrics():
    generator = torch.Generator().manual_seed(0)
    mask = torch.rand(6, 700, generator=generator) < 0.9
    old, roll = torch.randn(6, 700, generator=generator), torch.randn(6, 700, generator=generator)
    expected = position_metrics(old, roll, mask)
    rows = ms.bucket_stats(old, roll, mask, POSITION_BUCKET_EDGES)
    assert len(rows) == 3  # 0-127, 128-511, 512-1023 hold tokens
    for row in rows:
        for ours, theirs in (("tokens", "tokens"), ("k1", "kl"), ("k3", "k3_kl"), ("abs_diff", "abs_diff")):
            assert row[ours] == pytest.approx(expected[position_key(row["start"], row["end"], theirs)], rel=1e-12)


def test_tables_average_seeds_and_weight_buckets_by_tokens():
    summary = [{"config": c.label, "seed": s, "tokens": 10, "routing_flip": 0.1 * s,
                **{f"r3_{r3}/{k}": float(s + i) for r3, _ in ms.R3_SETTINGS for k, _ in ms.SUMMARY_KEYS}}
               for i, c in enumerate(ms.CONFIGS) for s in (0, 1)]
    frame = ms.summary_frame(summary)
    assert list(frame["config"]) == [c.label for c in ms.CONFIGS for _ in (0, 1)] and \
        list(frame["r3"][:2]) == ["on", "off"]
    assert frame.loc[2, "k1"] == 1.5 and frame.loc[0, "routing_flip"] == pytest.approx(0.05)
    positions = [{"config": "+ W8A8", "seed": 0, "r3": "on", "start": 0, "end": 32, "tokens": 3, "k1": 1.0, "k3": 0.0},
                 {"config": "+ W8A8", "seed": 1, "r3": "on", "start": 0, "end": 32, "tokens": 1, "k1": 5.0, "k3": 0.0},
                 {"config": "+ W8A8", "seed": 1, "r3": "off", "start": 0, "end": 32, "tokens": 1, "k1": 99.0,
                  "k3": 0.0}]
    assert ms.position_frame(positions, "k1").loc[0, "+ W8A8"] == 2.0  # (3 * 1 + 1 * 5) / 4, R3 off left out


def test_notebook_15_declares_its_parameters_and_stays_out_of_the_chain():
    declared = declared_parameters(NAME)
    assert set(notebook_parameters(NAME)) == set(declared)
    assert declared["recipe"] in ("tiny-cpu", "tiny-cpu-long") and NAME not in CHAIN
    nb = json.loads((NOTEBOOKS_DIR / f"{NAME}.ipynb").read_text())
    assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code")
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert "\nmismatch-sources:" in makefile and NAME in makefile


@pytest.mark.long
def test_notebook_records_what_the_library_measures(tmp_path):
    params = {"out_dir": str(tmp_path), "recipe": "tiny-cpu", "prompts": 2, "n": 2, "seeds": [0], "bucket_width": 4,
              "study_prompts": 1, "study_seeds": [0]}
    results = execute_notebook(NAME, tmp_path, params)
    assert results["kernel_python"] == sys.executable
    expected = ms.measure_seeds("tiny-cpu", 2, 2, [0], 4)
    assert results["summary_rows"] == expected["summary"]  # bit for bit: both ran on one torch thread
    assert results["position_rows"] == expected["positions"]
    assert results["lumenrl_bucket_rows"] == expected["lumenrl_buckets"]
    assert results["decode_gap"] == expected["decode_gap"]
    assert [r["config"] for r in results["summary_rows"]] == [c.label for c in ms.CONFIGS]
    tokens = results["summary_rows"][0]["tokens"]
    assert sum(r["tokens"] for r in results["position_rows"]
               if r["config"] == "weights only" and r["r3"] == "on") == tokens
    assert results["summary"] == ms.summary_frame(expected["summary"]).to_dict(orient="records")
    assert (tmp_path / "figures" / "mismatch_by_position.svg").is_file()
    # the attribution and fault sections (issue 31): what the library gives, each row the one it names
    attribution = ma.attribute_seeds("tiny-cpu", 1, 2, [0], 4)
    assert results["attribution_rows"] == attribution["summary"]
    assert results["attribution_positions"] == attribution["positions"]
    rows = {r["config"]: r for r in results["attribution_rows"]}
    assert list(rows) == [a.label for a in ma.ATTRIBUTION]
    # replaying changes what the trainer forwards, not what its own indexer / router would choose
    assert rows["all on, indexer replayed"]["indexer_disagree"] == rows["all on (the run)"]["indexer_disagree"]
    assert rows["all on, R3 off"]["routing_flip"] == rows["all on (the run)"]["routing_flip"]
    assert (tmp_path / "figures" / "mismatch_attribution.svg").is_file() and results["run_positions"] == {}
    faults = [f for f in mf.FAULTS if not f.stale_experts]  # stale_dir empty: that row is left out
    assert results["fault_rows"] == mf.measure_faults("tiny-cpu", 1, 2, [0], faults=tuple(faults))
    changed = {r["fault"]: r["tensors_changed"] for r in results["fault_rows"]}
    assert [changed[f.label] for f in faults] == [0, 0, 0, 42, 2, 4, 1, 12, 1]
