"""The shipped warm-started tiny checkpoint matches its recorded hashes and says how it was made."""

import json
import shutil

import pytest

from repro.model.assets import AssetError, hash_file_for, record_hashes, tiny_checkpoint_path, verify_hashes
from repro.model.warmstart_io import ensure_warm_checkpoint


def test_shipped_files_match_recorded_hashes():
    folder = tiny_checkpoint_path()
    assert (folder / "model.safetensors").is_file(), f"{folder} is not shipped"
    verify_hashes(folder)
    assert ensure_warm_checkpoint(log=lambda _: None) == folder  # present: nothing regenerated


def test_shipped_provenance_records_command_and_accuracies():
    provenance = json.loads((tiny_checkpoint_path() / "warmstart.json").read_text())
    assert provenance["command"].startswith("python -m repro warmstart")
    accuracy = provenance["accuracy_T0.8"]
    assert accuracy["temperature"] == 0.8 and accuracy["samples"] == 8
    assert 0.2 <= accuracy["train"]["avg@8"] <= 0.5
    assert accuracy["held_out"]["problems"] == 30


def test_tampering_is_detected_and_named(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights")
    record_hashes(folder)
    verify_hashes(folder)
    assert hash_file_for(folder).read_text().endswith("  ckpt/model.safetensors\n")
    (folder / "model.safetensors").write_bytes(b"other weights")
    with pytest.raises(AssetError, match="model.safetensors: sha256 differs"):
        verify_hashes(folder)
    shutil.copy(folder / "config.json", folder / "extra.json")
    with pytest.raises(AssetError, match="extra.json: not recorded"):
        verify_hashes(folder)
