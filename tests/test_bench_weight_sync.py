"""The weight-sync benchmark's pure parts: the synthetic checkpoint's names and size, and the estimate's arithmetic
(the measured run itself is benchmarks/bench_weight_sync.py, minutes long)."""

import importlib.util
from pathlib import Path

import pytest
import torch

from repro.model.served import served_from_headers, TensorSpec

spec_ = importlib.util.spec_from_file_location(
    "bench_weight_sync", Path(__file__).resolve().parents[1] / "benchmarks" / "bench_weight_sync.py")
bench = importlib.util.module_from_spec(spec_)
spec_.loader.exec_module(bench)
import sync_estimate  # noqa: E402  (benchmarks/, put on sys.path by the benchmark it serves)


def test_synthetic_checkpoint_has_release_names_and_the_size_asked_for():
    spec = bench.synthetic_spec(layers=30)
    names = [n for n, _, _ in spec]
    assert names[0] == "embed.weight" and names[-1] == "head.weight" and len(names) == len(set(names)) == 1656
    assert "layers.29.ffn.experts.7.w3.weight" in names and not any(n.startswith("mtp.") for n in names)
    shapes = dict((n, s) for n, s, _ in spec)
    assert shapes["layers.0.ffn.experts.0.w1.weight"] == (1024, 1024) and shapes["embed.weight"] == (32768, 1024)
    dtypes = {n: d for n, _, d in spec}
    assert dtypes["layers.3.hc_attn_fn"] == torch.float32 and dtypes["layers.3.attn.wq_a.weight"] == torch.bfloat16
    assert 2.3e9 < sum(bench.nbytes(s, d) for _, s, d in spec) < 2.4e9
    served = served_from_headers({n: TensorSpec(s, d) for n, s, d in spec}, "synthetic", "deepseek_v4")
    assert served.layout == "deepseek" and list(served.tensors)[0] == "embed.weight"  # the release's own layout
    stage0, stage1 = bench.pp_stage(spec, 0, 30), bench.pp_stage(spec, 1, 30)
    assert sorted(stage0 + stage1) == sorted(names) and "embed.weight" in stage0 and "head.weight" in stage1


def test_estimate_arithmetic():
    rows = sync_estimate.extrapolate(fp8_s_per_gb=2.0)
    # 400 Gb/s = 50 GB/s, 80% -> 40 GB/s: 568 GB in 14.2 s; four stages 160 GB/s; verl's 8.25 GB/s per sender
    assert [round(r["transfer_s"], 2) for r in rows] == [14.2, 3.55, round(568 / 8.25, 2), round(568 / 33, 2)]
    assert rows[0]["fp8_s"] == pytest.approx(568 * 2.0 / 8)
    assert sync_estimate.extrapolate(stages=16)[1]["GB/s"] == 320.0  # capped by the rollout node's 8 NICs


def test_sync_costs_side_by_side():
    # 568 GB: ours before crosses PCIe 4 times at 25 GB/s and CRCs twice at 2 GB/s; ours after checksums twice on the
    # device at 1000 GB/s; vLLM's engine adds nothing to the wire's 14.2 s
    costs = sync_estimate.sync_costs(568.0, 14.2, crc_gbps=2.0)
    assert costs["ours before"] == pytest.approx({"transfer_s": 14.2, "crossing_s": 90.88, "checksum_s": 568.0,
                                                  "total_s": 14.2 + 90.88 + 568.0})
    assert costs["ours after"] == pytest.approx({"transfer_s": 14.2, "crossing_s": 0.0, "checksum_s": 1.136,
                                                 "total_s": 15.336})
    assert costs["vLLM engine"]["total_s"] == 14.2
    rows = sync_estimate.extrapolate(crc_gbps=2.0)
    assert sorted(rows[0]["costs"]) == ["ours after", "ours before", "vLLM engine"]
    assert sorted(rows[1]["costs"]) == ["ours after", "ours before"]  # vLLM's engine has one source rank
    # ours take the stages' streams in turn: the per-stage row moves at one sender's rate
    assert rows[1]["costs"]["ours after"]["transfer_s"] == pytest.approx(14.2)

