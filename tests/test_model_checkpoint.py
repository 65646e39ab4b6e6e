"""Tiny checkpoints: HF layout, Auto* loading, identical logits after a round trip, pickle formats refused."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from repro.model.hf_folder import CheckpointError, check_safetensors_only, load_checkpoint, save_checkpoint
from repro.model.tiny import build_tiny_model
from repro.model.tokenizer import build_tiny_tokenizer


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model, tokenizer = build_tiny_model(seed=1), build_tiny_tokenizer()
    folder = save_checkpoint(model, tokenizer, tmp_path_factory.mktemp("ckpt") / "tiny")
    return model, folder


def test_folder_has_hf_layout_and_no_temp_leftovers(saved):
    _, folder = saved
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= names
    assert [p.name for p in folder.parent.iterdir()] == ["tiny"]  # the temp folder was renamed, not copied
    generation = json.loads((folder / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"], generation["pad_token_id"]) == (0, 1, 2)


def test_round_trip_gives_identical_logits_in_float32(saved):
    model, folder = saved
    loaded, _ = load_checkpoint(folder)
    ids = torch.tensor([[0, 6, 10, 13, 3, 8, 15, 16, 17, 18]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    assert torch.equal(loaded.model.layers[0].mlp.gate.tid2eid, model.model.layers[0].mlp.gate.tid2eid)


def test_auto_classes_load_the_folder_like_a_hub_model(saved):
    _, folder = saved
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, use_safetensors=True, local_files_only=True)
    assert type(model).__name__ == "DeepseekV4ForCausalLM"
    ids = tokenizer("37+05=").input_ids
    assert ids[0] == tokenizer.bos_token_id and len(ids) == 7
    assert tokenizer.decode(tokenizer("Answer: 42").input_ids + [tokenizer.eos_token_id],
                            skip_special_tokens=True) == "Answer: 42"
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (0, 1, 2)


def test_pickle_only_folder_is_refused_naming_the_file(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(CheckpointError, match="pytorch_model.bin"):
        load_checkpoint(tmp_path)


def test_pickle_file_beside_safetensors_is_refused(saved, tmp_path):
    _, folder = saved
    for file in folder.iterdir():
        (tmp_path / file.name).write_bytes(file.read_bytes())
    (tmp_path / "optimizer.pt").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="optimizer.pt"):
        check_safetensors_only(tmp_path)


def test_missing_folder_and_missing_weights_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        check_safetensors_only(tmp_path / "nowhere")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="safetensors"):
        check_safetensors_only(tmp_path)
