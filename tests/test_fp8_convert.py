"""Checkpoint conversion of a tiny genuine DeepSeek-V4: layout, numbers, parallel workers, resume, CLI."""

import hashlib
import json
import shutil

import pytest
import torch
from safetensors import safe_open

import repro.fp8.convert as convert_mod
from repro.cli import main as cli_main
from repro.fp8.convert import ConvertOptions, convert_checkpoint
from repro.fp8.rules import decide
from repro.fp8.stream import quantize_tensors
from repro.model.tiny_release import build_tiny_checkpoint
from repro.model.tiny import build_tiny_model
from repro.fp8.verify import rel_error_bound, verify_checkpoint

QC = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
      "scale_fmt": None}
FAST = dict(progress=False, fsync=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The project's tiny DSV4 as the release ships BF16 weights (its names; FP32 where it keeps FP32), in shards
    + index, with its tokenizer."""
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "bf16")


@pytest.fixture(scope="module")
def converted(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "fp8"
    return convert_checkpoint(tiny, out, ConvertOptions(**FAST))


def _shard_hashes(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.safetensors"))}


def test_output_layout(tiny, converted):
    out = converted.output_dir
    assert not out.with_name(out.name + ".partial").exists()
    names = sorted(p.name for p in out.iterdir())
    # every file of the input's but its hidden ones (build-tiny's .repro-model.json marks the input folder only)
    assert names == sorted([p.name for p in tiny.iterdir() if not p.name.startswith(".")] + ["fp8_conversion.json"])
    assert {"tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= set(names)
    for extra in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / extra).read_bytes() == (tiny / extra).read_bytes()
    cfg = json.loads((out / "config.json").read_text())
    src_cfg = json.loads((tiny / "config.json").read_text())
    assert cfg["quantization_config"] == QC
    # vLLM reads expert_dtype from the top level and takes a missing one as "fp4" (MXFP4 experts)
    assert cfg["expert_dtype"] == "fp8"
    assert {k: v for k, v in cfg.items() if k not in ("quantization_config", "expert_dtype")} == src_cfg

    index = json.loads((out / "model.safetensors.index.json").read_text())
    total = 0
    for name, shard in index["weight_map"].items():
        with safe_open(out / shard, "pt") as f:
            t = f.get_tensor(name)  # every entry is where the index says
            total += t.numel() * t.element_size()
    assert index["metadata"]["total_size"] == total
    n_fp8 = sum(1 for n in index["weight_map"] if n.endswith(".scale"))  # the release's scale spelling
    assert n_fp8 == converted.summary["tensors_fp8"] == 130
    assert not any(n.endswith("_scale_inv") for n in index["weight_map"])
    assert converted.summary["tensors"] == 210 and converted.shards == 5


def test_numbers_through_the_safetensors_loader(tiny, converted):
    table = verify_checkpoint(tiny, converted.output_dir)
    fp8, kept = table[table.action == "fp8"], table[table.action == "keep"]
    assert len(fp8) == 130 and len(kept) == 80
    assert (fp8.dtype == "float8_e4m3fn").all() and fp8.finite.all()
    assert fp8.rel_error.max() <= rel_error_bound("e4m3fn")
    assert 0.02 < fp8.rel_error.median() < 0.03
    assert kept.identical.all()  # high-precision tensors copied bit for bit
    # the converter's own in-pass error figures agree with the independent check
    mine = converted.table().set_index("name")
    for row in fp8.itertuples():
        assert mine.loc[row.name, "rel_error"] == pytest.approx(row.rel_error, rel=1e-3)
    # edge blocks: 64-wide projections get one partial block
    with safe_open(converted.output_dir / _shard_of(converted, "layers.0.attn.wq_a.weight"), "pt") as f:
        scale = f.get_tensor("layers.0.attn.wq_a.scale")
    assert tuple(scale.shape) == (1, 1) and scale.dtype == torch.float32  # vLLM's FP8-expert path reads FP32
    assert converted.summary["size_ratio"] < 0.6


def _shard_of(result, name):
    index = json.loads((result.output_dir / "model.safetensors.index.json").read_text())
    return index["weight_map"][name]


def test_parallel_workers_write_identical_bytes(tiny, converted, tmp_path):
    par = convert_checkpoint(tiny, tmp_path / "par", ConvertOptions(workers=2, **FAST))
    assert _shard_hashes(par.output_dir) == _shard_hashes(converted.output_dir)
    assert par.peak_rss_bytes > 0


def test_killed_run_leaves_nothing_complete_and_resumes(tiny, converted, tmp_path, monkeypatch):
    real = convert_mod._convert_shard
    calls = []

    def dies_on_third(*args, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # stands in for a kill in the middle of a run
        return real(*args, **kw)

    monkeypatch.setattr(convert_mod, "_convert_shard", dies_on_third)
    dst = tmp_path / "fp8"
    with pytest.raises(KeyboardInterrupt):
        convert_checkpoint(tiny, dst, ConvertOptions(**FAST))
    partial = tmp_path / "fp8.partial"
    assert not dst.exists() and partial.is_dir()
    assert not (partial / "config.json").exists()  # nothing that looks like a finished checkpoint
    assert len(list((partial / ".done").glob("*.json"))) == 2

    monkeypatch.setattr(convert_mod, "_convert_shard", real)
    resumed = convert_checkpoint(tiny, dst, ConvertOptions(**FAST))
    assert resumed.shards_resumed == 2
    assert _shard_hashes(dst) == _shard_hashes(converted.output_dir)
    assert len(resumed.stats) == 210  # stats of resumed shards come from their markers


def test_resume_redoes_a_damaged_shard_and_restarts_on_new_options(tiny, tmp_path, monkeypatch):
    real = convert_mod._convert_shard
    calls = []

    def dies_on_fourth(*args, **kw):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(convert_mod, "_convert_shard", dies_on_fourth)
    dst = tmp_path / "fp8"
    with pytest.raises(KeyboardInterrupt):
        convert_checkpoint(tiny, dst, ConvertOptions(**FAST))
    monkeypatch.setattr(convert_mod, "_convert_shard", real)
    partial = tmp_path / "fp8.partial"
    done = sorted((partial / ".done").glob("*.json"))
    assert len(done) == 3
    victim = partial / done[0].name.removesuffix(".json")
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF  # flip one bit of a finished shard: its CRC-32 no longer matches the marker
    victim.write_bytes(bytes(data))
    assert convert_checkpoint(tiny, dst, ConvertOptions(**FAST)).shards_resumed == 2

    # a different format does not reuse shards of the old one
    shutil.rmtree(dst)
    with pytest.raises(KeyboardInterrupt):
        calls.clear()
        monkeypatch.setattr(convert_mod, "_convert_shard", dies_on_fourth)
        convert_checkpoint(tiny, dst, ConvertOptions(**FAST))
    monkeypatch.setattr(convert_mod, "_convert_shard", real)
    fnuz = convert_checkpoint(tiny, dst, ConvertOptions(fmt="e4m3fnuz", **FAST))
    assert fnuz.shards_resumed == 0
    assert verify_checkpoint(tiny, dst).query("action == 'fp8'").dtype.eq("float8_e4m3fnuz").all()


def test_existing_output_needs_overwrite_and_overwrite_replaces_only_a_conversion(tiny, tmp_path):
    dst = tmp_path / "fp8"
    convert_checkpoint(tiny, dst, ConvertOptions(**FAST))
    (dst / "old.txt").write_text("x")
    with pytest.raises(Exception, match="exists"):
        convert_checkpoint(tiny, dst, ConvertOptions(**FAST))
    convert_checkpoint(tiny, dst, ConvertOptions(overwrite=True, pow2_scale=True, **FAST))  # its manifest: ours
    assert not (dst / "old.txt").exists() and (dst / "config.json").exists()
    assert json.loads((dst / "fp8_conversion.json").read_text())["options"]["pow2_scale"] is True
    mine = tmp_path / "mine"  # a folder the user made: never replaced (tests/test_hostile_input.py has the rest)
    mine.mkdir()
    (mine / "notes.txt").write_text("x")
    with pytest.raises(Exception, match="not a converted checkpoint repro wrote"):
        convert_checkpoint(tiny, mine, ConvertOptions(overwrite=True, **FAST))
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_pow2_scales_checkpoint(tiny, tmp_path):
    res = convert_checkpoint(tiny, tmp_path / "ue8m0", ConvertOptions(pow2_scale=True, **FAST))
    cfg = json.loads((res.output_dir / "config.json").read_text())
    assert cfg["quantization_config"] == {**QC, "scale_fmt": "ue8m0"}
    name = "layers.1.ffn.experts.3.w2.scale"
    with safe_open(res.output_dir / _shard_of(res, name), "pt") as f:
        mantissa, _ = torch.frexp(f.get_tensor(name))
    assert (mantissa == 0.5).all()
    assert res.summary["rel_error_max"] <= rel_error_bound("e4m3fn", pow2_scale=True)


def test_iterator_on_an_in_memory_state_dict():
    """The weight-sync path: transformers' module names, fused 3-D experts, fp32-kept modules."""
    model = build_tiny_model(seed=1)
    sd = model.state_dict()
    stats = []
    out = dict(quantize_tensors(sd.items(), "e4m3fnuz", on_stats=stats.append))
    assert len(stats) == len(sd)
    for name, t in sd.items():
        if decide(name, tuple(t.shape), t.dtype).quantise:
            assert out[name].dtype == torch.float8_e4m3fnuz
            assert out[name + "_scale_inv"].shape[:-2] == t.shape[:-2]
        else:
            assert out[name] is t
    gu = out["model.layers.1.mlp.experts.gate_up_proj"]
    assert gu.shape == (8, 256, 128) and out["model.layers.1.mlp.experts.gate_up_proj_scale_inv"].shape == (8, 2, 1)
    assert max(s.rel_error for s in stats if s.action == "fp8") <= rel_error_bound("e4m3fnuz")


def test_cli(tiny, tmp_path, capsys):
    assert cli_main(["convert", "--input", str(tiny), "--list"]) == 0
    listing = capsys.readouterr().out
    assert "layers.1.attn.indexer.weights_proj.weight" in listing and "indexer scorer" in listing
    dst = tmp_path / "cli"
    assert cli_main(["convert", "--input", str(tiny), "--output", str(dst), "--format", "e4m3fnuz", "--json",
                     "--no-fsync"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["tensors_fp8"] == 130 and summary["format"] == "e4m3fnuz" and summary["peak_rss_mib"] > 0
    assert cli_main(["convert", "--input", str(tiny), "--output", str(dst), "--quiet"]) == 1
    assert "exists" in capsys.readouterr().err
