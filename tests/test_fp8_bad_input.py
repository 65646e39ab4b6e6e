"""One test per bad input: each fails with CheckpointError naming the file (and tensor), leaving no output."""

import json

import pytest
import torch
from safetensors.torch import save_file

from repro.cli import main as cli_main
from repro.errors import CheckpointError
from repro.fp8.convert import ConvertOptions, convert_checkpoint

CONFIG = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4"}


def _tensors(seed):
    g = torch.Generator().manual_seed(seed)
    return {
        f"layers.{seed}.attn.wq_a.weight": (torch.randn(200, 130, generator=g) * 0.02).bfloat16(),
        f"layers.{seed}.attn_norm.weight": torch.ones(130, dtype=torch.bfloat16),
    }


def make_checkpoint(path, shards=None, config=CONFIG, index=True):
    """A small two-shard BF16 checkpoint folder; `shards` maps file name -> {tensor name: tensor}."""
    shards = shards or {"model-00001-of-00002.safetensors": _tensors(0),
                        "model-00002-of-00002.safetensors": _tensors(1)}
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    weight_map = {}
    for fname, tensors in shards.items():
        save_file(tensors, path / fname, metadata={"format": "pt"})
        weight_map.update({n: fname for n in tensors})
    if index:
        (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


def _fails(src, dst, *fragments, **opts):
    with pytest.raises(CheckpointError) as info:
        convert_checkpoint(src, dst, ConvertOptions(progress=False, fsync=False, **opts))
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    assert not dst.exists(), "no output folder after bad input"
    assert not dst.with_name(dst.name + ".partial").exists(), "no partial folder after bad input"
    return message


def test_good_input_converts(tmp_path):
    res = convert_checkpoint(make_checkpoint(tmp_path / "in"), tmp_path / "out", ConvertOptions(progress=False))
    assert res.summary["tensors_fp8"] == 2 and res.summary["tensors_kept"] == 2


def test_missing_shard_named_in_index(tmp_path):
    src = make_checkpoint(tmp_path / "in")
    (src / "model-00002-of-00002.safetensors").unlink()
    _fails(src, tmp_path / "out", "model-00002-of-00002.safetensors", "missing shard", "model.safetensors.index.json")


def test_index_names_a_tensor_its_shard_lacks(tmp_path):
    src = make_checkpoint(tmp_path / "in")
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"]["layers.9.attn.wo_a.weight"] = "model-00001-of-00002.safetensors"
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    _fails(src, tmp_path / "out", "layers.9.attn.wo_a.weight", "model-00001-of-00002.safetensors")


def test_tensor_of_unexpected_dtype(tmp_path):
    tensors = _tensors(1)
    tensors["layers.1.attn.wq_a.weight"] = tensors["layers.1.attn.wq_a.weight"].double()
    src = make_checkpoint(tmp_path / "in", {"a.safetensors": _tensors(0), "b.safetensors": tensors})
    _fails(src, tmp_path / "out", "b.safetensors", "layers.1.attn.wq_a.weight", "float64")


def test_already_fp8_tensor_in_a_bf16_checkpoint(tmp_path):
    tensors = _tensors(0)
    tensors["layers.0.attn.wq_a.weight"] = tensors["layers.0.attn.wq_a.weight"].to(torch.float8_e4m3fn)
    src = make_checkpoint(tmp_path / "in", {"a.safetensors": tensors})
    _fails(src, tmp_path / "out", "a.safetensors", "layers.0.attn.wq_a.weight", "float8_e4m3fn")


def test_nan_in_a_weight(tmp_path):
    tensors = _tensors(1)
    tensors["layers.1.attn.wq_a.weight"][150, 129] = float("nan")  # in the edge block
    # the first shard converts fine before the second fails: the partial output must still be removed
    src = make_checkpoint(tmp_path / "in", {"a.safetensors": _tensors(0), "b.safetensors": tensors})
    _fails(src, tmp_path / "out", "b.safetensors", "layers.1.attn.wq_a.weight", "NaN or Inf")


def test_inf_in_a_kept_tensor(tmp_path):
    tensors = _tensors(0)
    tensors["layers.0.attn_norm.weight"][3] = float("-inf")
    src = make_checkpoint(tmp_path / "in", {"a.safetensors": tensors})
    _fails(src, tmp_path / "out", "a.safetensors", "layers.0.attn_norm.weight", "NaN or Inf")


def test_truncated_safetensors_file(tmp_path):
    src = make_checkpoint(tmp_path / "in")
    shard = src / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1000])
    _fails(src, tmp_path / "out", "model-00002-of-00002.safetensors", "truncated")


def test_corrupt_safetensors_header(tmp_path):
    src = make_checkpoint(tmp_path / "in")
    shard = src / "model-00001-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[8:20] = b"#not json!#!"
    shard.write_bytes(bytes(data))
    _fails(src, tmp_path / "out", "model-00001-of-00002.safetensors", "corrupt")


def test_config_of_a_model_that_is_not_a_causal_lm(tmp_path):
    src = make_checkpoint(tmp_path / "in", config={"architectures": ["BertModel"], "model_type": "bert"})
    _fails(src, tmp_path / "out", "config.json", "not a causal LM", "BertModel")


def test_config_that_is_not_json(tmp_path):
    src = make_checkpoint(tmp_path / "in")
    (src / "config.json").write_text("{architectures: oops")
    _fails(src, tmp_path / "out", "config.json", "not valid JSON")


def test_already_quantised_checkpoint(tmp_path):
    src = make_checkpoint(tmp_path / "in", config={**CONFIG, "quantization_config": {"quant_method": "fp8"}})
    _fails(src, tmp_path / "out", "config.json", "already quantised")


def test_error_above_threshold(tmp_path):
    src = make_checkpoint(tmp_path / "in")
    _fails(src, tmp_path / "out", "layers.0.attn.wq_a.weight", "above the threshold", max_rel_error=1e-3)


def test_cli_reports_bad_input_in_one_line(tmp_path, capsys):
    src = make_checkpoint(tmp_path / "in")
    (src / "model-00001-of-00002.safetensors").unlink()
    assert cli_main(["convert", "--input", str(src), "--output", str(tmp_path / "out"), "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("repro convert: error:") and "missing shard" in err and "\n" not in err
