"""The tiny DeepSeek-V4 in the release's layout: its name table, dtypes and config keys; transformers loads it to the
same logits as the in-memory layout; MTP is carried by the folder and by no sync; names travel with the checkpoint
through the embedded lane with FP32 tensors arriving as FP32."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from repro.errors import CheckpointError
from repro.model import layouts
from repro.model.hf_folder import load_tiny_model
from repro.model.served import served_from_folder
from repro.model.tiny import build_tiny_model
from repro.model.tiny_release import write_checkpoint
from repro.model.tokenizer import build_tiny_tokenizer
from repro.rollout.embedded import EmbeddedEngine, RolloutError
from repro.sync.apply import apply_stream
from repro.sync.stream import pack_buckets
from repro.train.embedded import EmbeddedTrainer
from repro.train.grpo_update import TrainerSettings

pytestmark = pytest.mark.usefixtures("one_thread")

# Layer 1 of the tiny model (compressed-sparse attention, top-k MoE) as the release stores it, experts 0 only.
LAYER_1 = {
    "attn.attn_sink": ((4,), "F32"),
    "attn.compressor.ape": ((4, 128), "F32"),
    "attn.compressor.norm.weight": ((64,), "BF16"),
    "attn.compressor.wgate.weight": ((128, 128), "BF16"),
    "attn.compressor.wkv.weight": ((128, 128), "BF16"),
    "attn.indexer.compressor.ape": ((4, 64), "F32"),
    "attn.indexer.compressor.norm.weight": ((32,), "BF16"),
    "attn.indexer.compressor.wgate.weight": ((64, 128), "BF16"),
    "attn.indexer.compressor.wkv.weight": ((64, 128), "BF16"),
    "attn.indexer.weights_proj.weight": ((8, 128), "BF16"),
    "attn.indexer.wq_b.weight": ((256, 64), "BF16"),
    "attn.kv_norm.weight": ((64,), "BF16"),
    "attn.q_norm.weight": ((64,), "BF16"),
    "attn.wkv.weight": ((64, 128), "BF16"),
    "attn.wo_a.weight": ((128, 128), "BF16"),
    "attn.wo_b.weight": ((128, 128), "BF16"),
    "attn.wq_a.weight": ((64, 128), "BF16"),
    "attn.wq_b.weight": ((256, 64), "BF16"),
    "attn_norm.weight": ((128,), "BF16"),
    "ffn.experts.0.w1.weight": ((128, 128), "BF16"),
    "ffn.experts.0.w2.weight": ((128, 128), "BF16"),
    "ffn.experts.0.w3.weight": ((128, 128), "BF16"),
    "ffn.gate.bias": ((8,), "F32"),
    "ffn.gate.weight": ((8, 128), "BF16"),
    "ffn.shared_experts.w1.weight": ((128, 128), "BF16"),
    "ffn.shared_experts.w2.weight": ((128, 128), "BF16"),
    "ffn.shared_experts.w3.weight": ((128, 128), "BF16"),
    "ffn_norm.weight": ((128,), "BF16"),
    "hc_attn_base": ((8,), "F32"),
    "hc_attn_fn": ((8, 256), "F32"),
    "hc_attn_scale": ((3,), "F32"),
    "hc_ffn_base": ((8,), "F32"),
    "hc_ffn_fn": ((8, 256), "F32"),
    "hc_ffn_scale": ((3,), "F32"),
}
GLOBALS = {"embed.weight": ((25, 128), "BF16"), "head.weight": ((25, 128), "BF16"), "norm.weight": ((128,), "BF16"),
           "hc_head_fn": ((2, 256), "F32"), "hc_head_base": ((2,), "F32"), "hc_head_scale": ((1,), "F32")}


def header(folder):
    """name -> (shape, safetensors dtype) of every tensor of a one-file folder."""
    with open(folder / "model.safetensors", "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        entries = json.loads(f.read(size))
    entries.pop("__metadata__", None)
    return {n: (tuple(e["shape"]), e["dtype"]) for n, e in entries.items()}


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(seed=0)


@pytest.fixture(scope="module")
def release(model, tmp_path_factory):
    return write_checkpoint(model, build_tiny_tokenizer(), tmp_path_factory.mktemp("rel") / "v4", mtp_layers=1)


def test_release_name_table_dtypes_and_config_keys(release):
    names = header(release)
    assert {n: v for n, v in names.items() if n.startswith("layers.1.") and ".experts." not in n or
            n.startswith("layers.1.ffn.experts.0.")} == {f"layers.1.{k}": v for k, v in LAYER_1.items()}
    assert {n: names[n] for n in GLOBALS} == GLOBALS
    assert names["layers.0.ffn.gate.tid2eid"] == ((25, 2), "I64") and "layers.0.ffn.gate.bias" not in names
    assert "layers.0.attn.compressor.ape" not in names  # layer 0 is sliding: no compressor
    main = [n for n in names if not n.startswith("mtp.")]
    # the MTP layer: a sliding-attention, top-k-MoE block (45 tensors) plus e_proj/h_proj, three norms, an mHC head
    assert len(main) == 210 and len(names) - len(main) == 45 + 8
    assert {"mtp.0.e_proj.weight", "mtp.0.h_proj.weight", "mtp.0.enorm.weight", "mtp.0.hnorm.weight",
            "mtp.0.norm.weight", "mtp.0.hc_head_fn", "mtp.0.hc_attn_fn", "mtp.0.ffn.gate.bias",
            "mtp.0.attn.wq_a.weight"} <= set(names)
    assert names["mtp.0.hc_head_fn"] == ((2, 256), "F32") and names["mtp.0.e_proj.weight"] == ((128, 128), "BF16")
    config = json.loads((release / "config.json").read_text())
    assert config["compress_ratios"] == [0, 4, 8, 4, 0] and config["num_hash_layers"] == 1
    assert config["qk_rope_head_dim"] == 16 and config["topk_method"] == "noaux_tc"
    assert config["num_nextn_predict_layers"] == 1 and config["torch_dtype"] == "bfloat16"
    assert "mlp_layer_types" not in config and "partial_rotary_factor" not in config


def fresh(model):
    """The model with every parameter in memory of its own. Tensors transformers reads straight from a file keep
    the file's byte offsets, and a matmul over differently aligned memory may round differently (measured: up to
    3e-7 in these logits for the in-memory layout, whose tensors load without a copy)."""
    with torch.no_grad():
        for param in model.parameters():
            param.data = param.data.clone()
    return model


def test_transformers_loads_the_release_layout_to_identical_logits(model, tmp_path):
    """One model written in both layouts (fp32, and the release's BF16 dtypes): logits equal bit for bit, and in
    fp32 equal to the in-memory model's."""
    tokenizer = build_tiny_tokenizer()
    ids = torch.tensor([[0, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]])
    for dtype in (None, torch.bfloat16):
        folders = {layout: write_checkpoint(model, tokenizer, tmp_path / f"{layout}-{dtype}", layout=layout,
                                            dtype=dtype) for layout in layouts.LAYOUTS}
        with torch.no_grad():
            logits = {layout: fresh(load_tiny_model(f))(ids).logits for layout, f in folders.items()}
            if dtype is None:
                assert torch.equal(logits[layouts.DEEPSEEK], model(ids).logits)
        assert torch.equal(logits[layouts.DEEPSEEK], logits[layouts.HF]), dtype
        assert served_from_folder(folders[layouts.HF]).layout == layouts.HF


def test_the_shipped_warm_start_is_in_the_release_layout():
    from repro.model.assets import tiny_checkpoint_path

    served = served_from_folder(tiny_checkpoint_path())
    assert served.layout == layouts.DEEPSEEK and len(served.synced) == 210 and not served.mtp
    assert {s.dtype for s in served.tensors.values()} == {torch.float32, torch.int64}  # trained fp32, kept so


def test_a_save_pretrained_folder_is_refused_by_name(model, tmp_path):
    model.save_pretrained(tmp_path / "mixed")  # transformers 5.24 writes e.g. model.layers.0.attn.norm.weight
    (tmp_path / "mixed" / "tokenizer.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"fit neither layout.*model\.layers\.0\.attn"):
        load_tiny_model(tmp_path / "mixed")


def test_names_travel_through_the_embedded_lane_and_fp32_arrives_as_fp32(release):
    """bf16 trainer on the BF16 release -> buckets -> embedded engine: release names, the folder's dtypes, MTP left
    out (and refused with the reason), an FP32 change smaller than BF16 resolution arriving intact."""
    trainer = EmbeddedTrainer(release, TrainerSettings(dtype="bf16", max_tokens_per_micro_batch=16384, temperature=0.8))
    engine = EmbeddedEngine(load_tiny_model(release), eos_id=1, pad_id=2, max_context=32)
    fn = trainer.model.model.layers[1].attn_hc.fn
    assert fn.dtype == torch.float32 and trainer.model.lm_head.weight.dtype == torch.bfloat16
    with torch.no_grad():
        fn.add_(fn.abs() * 2.0**-12)  # a BF16 round trip would undo this
    weights = list(trainer.named_weights())
    names = [n for n, _ in weights]
    assert names[0] == "embed.weight" and "layers.1.ffn.experts.7.w3.weight" in names and len(names) == 210
    assert not any(n.startswith("mtp.") for n in names)
    spec = served_from_folder(release).tensors
    assert all(t.dtype == spec[n].dtype and tuple(t.shape) == spec[n].shape for n, t in weights)
    # experts cut across buckets
    apply_stream(engine, pack_buckets(weights, bucket_bytes=1 << 16, version=1), version=1)
    served = engine.model.model.layers[1].attn_hc.fn
    assert served.dtype == torch.float32 and torch.equal(served, fn.detach())
    bf16 = dict(weights)
    bf16["layers.1.hc_attn_fn"] = bf16["layers.1.hc_attn_fn"].bfloat16()
    with pytest.raises(RolloutError, match="layers.1.hc_attn_fn is bfloat16, the checkpoint stores float32"):
        engine.update_weights(bf16.items(), version=2)
    mtp = dict(weights, **{"mtp.0.e_proj.weight": torch.zeros(128, 128, dtype=torch.bfloat16)})
    with pytest.raises(RolloutError, match=r"unexpected tensors \['mtp.0.e_proj.weight'\] \(the MTP layer"):
        engine.update_weights(mtp.items(), version=2)
    in_memory = dict(trainer.model.state_dict())
    with pytest.raises(RolloutError, match=r"missing tensors \['embed.weight'"):
        engine.update_weights(in_memory.items(), version=2)  # transformers' names are not this folder's
    assert engine.weight_version == 1


def test_official_fp8_fp4_storage_is_listed_and_verified(tmp_path, capsys):
    """`repro convert --list` reads deepseek-ai's storage (F8_E4M3 + F8_E8M0 `.scale`, packed MXFP4 experts as I8
    or F4); the verifier dequantises both against the BF16 weights they came from."""
    from repro.cli import main
    from repro.fp8.verify import rel_error_bound, verify_checkpoint

    assert main(["build-tiny", "--out", str(tmp_path / "bf16")]) == 0
    for storage in ("int8", "F4"):
        out = tmp_path / storage
        assert main(["build-tiny", "--out", str(out), "--official-fp8", "--fp4-storage", storage]) == 0
        capsys.readouterr()
        assert main(["convert", "--input", str(out), "--list"]) == 0
        listing = capsys.readouterr().out
        assert "layers.1.attn.wq_b.scale" in listing and "E8M0, powers of two" in listing
        assert "MXFP4 e2m1, two values a byte" in listing
        with safe_open(out / "model.safetensors", "pt") as f:
            assert f.get_slice("layers.1.ffn.experts.0.w1.weight").get_dtype() == {"int8": "I8", "F4": "F4"}[storage]
        table = verify_checkpoint(tmp_path / "bf16", out).set_index("name")
        assert (table.action == "fp4").sum() == 96 and (table.action == "fp8").sum() == 34
        assert table[table.action == "fp8"].rel_error.max() <= rel_error_bound("e4m3fn", pow2_scale=True)
        assert 0.09 < table[table.action == "fp4"].rel_error.median() < 0.14  # MXFP4 of Gaussian weights
        assert table[table.action == "keep"].identical.all()
