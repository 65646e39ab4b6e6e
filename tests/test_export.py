"""`repro export`: a run's checkpoint -> a release- or transformers-layout safetensors folder with a model card.

The run here is made without the RL loop (which takes minutes): the tiny recipe's embedded trainer, built as a
run builds it, takes one real AdamW update (``MasterAdamW.step``) on seeded synthetic gradients -- so its fp32
masters differ from its BF16 weights in the low bits, as after training -- and is saved by the run's own
``save_checkpoint`` beside a hand-written metrics log. The trainer the tests compare against is loaded from that
checkpoint the way ``--resume`` loads it (``EmbeddedTrainer.from_recipe`` + ``load``).
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from repro.cli import main
from repro.errors import CheckpointError
from repro.fp8.safetensors_io import StreamingWriter
from repro.model import layouts
from repro.recipes import load_recipe
from repro.run.checkpoints import save_checkpoint, seal_checkpoint
from repro.run.export import export_run
from repro.run.run_dir import prepare_run_dir, resolve_model_dir
from repro.train.embedded import EmbeddedTrainer
from repro.train.grpo_update import TrainerSettings

ROOT = Path(__file__).resolve().parents[1]
IDS = torch.tensor([[0, 7, 12, 3, 9, 14, 4, 22, 5], [0, 18, 6, 11, 2, 2, 2, 2, 2]])  # two rows, one padded
ACCURACY = [0.25, 0.5, 0.75]  # the hand-written log: three train steps and two evaluations
EVALS = {0: [2, 0, 1, 2], 3: [2, 2, 1, 2]}  # per-problem correct counts of 2 samples


def _metrics_rows() -> list[dict]:
    rows = [{"kind": "eval", "step": 0, "eval/avg@2": sum(EVALS[0]) / 8, "eval/correct_counts": EVALS[0],
             "eval/num_problems": 4, "eval/samples_per_problem": 2}]
    for step, acc in enumerate(ACCURACY, 1):
        rows.append({"kind": "train", "step": step, "reward/accuracy": acc, "critic/score/mean": 2 * acc - 1,
                     "rollout_corr/kl": 0.001 * step, "rollout_corr/k3_kl": 0.002 * step,
                     "rollout_corr/rollout_is_eff_sample_size": 0.9 + 0.01 * step})
    rows.append({"kind": "eval", "step": 3, "eval/avg@2": sum(EVALS[3]) / 8, "eval/correct_counts": EVALS[3],
                 "eval/num_problems": 4, "eval/samples_per_problem": 2})
    return rows


def _trainer(recipe):
    return EmbeddedTrainer.from_recipe(recipe, resolve_model_dir(recipe))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, one_thread):
    recipe = load_recipe("tiny-cpu", ["steps=3"])
    run = tmp_path_factory.mktemp("run") / "tiny"
    prepare_run_dir(recipe, run, resume=False)
    metrics = run / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in _metrics_rows()))
    trainer = _trainer(recipe)
    generator = torch.Generator().manual_seed(0)
    for p in trainer.opt.model_params:
        p.grad = torch.randn(p.shape, generator=generator).to(p.dtype)
    trainer.opt.step(lr=1e-3)
    trainer.step = trainer.updates = 3
    save_checkpoint(run / "checkpoints", 3, trainer, {"weight_version": 3}, metrics, keep_last=2)
    return run


@pytest.fixture(scope="module")
def resumed(run_dir):
    """The trainer as --resume restores it, and its logits on IDS."""
    from repro.analysis.frame import read_recipe

    recipe, _ = read_recipe(run_dir / "recipe.yaml")
    trainer = _trainer(recipe)
    trainer.load(run_dir / "checkpoints" / "step_000003" / "trainer")
    with torch.no_grad():
        logits = trainer.model(input_ids=IDS, use_cache=False).logits
    return trainer, logits


def test_hf_export_loads_in_transformers_to_the_trainers_logits_exactly(run_dir, resumed, tmp_path):
    from transformers import AutoModelForCausalLM

    trainer, logits = resumed
    out = export_run(run_dir, tmp_path / "hf", layout="hf", max_shard_bytes=1_000_000).folder
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 4 and not (out / "model.safetensors").exists()
    state = trainer.model.state_dict()
    assert sorted(index["weight_map"]) == sorted(state)
    written = {}
    for shard in shards:
        written.update(load_file(out / shard))
    for name, tensor in state.items():  # the trainer's own BF16 weights (FP32 where the release keeps FP32)
        assert written[name].dtype == tensor.dtype and torch.equal(written[name], tensor), name
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in written.values())
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    with torch.no_grad():
        got = model(input_ids=IDS, use_cache=False).logits
    assert got.dtype == logits.dtype == torch.bfloat16
    assert torch.equal(got, logits)


def test_release_export_round_trips_through_repros_loader(run_dir, resumed, tmp_path):
    from repro.model.hf_folder import load_tiny_model
    from repro.model.served import served_from_folder

    trainer, logits = resumed
    assert main([
        "export", str(run_dir), "--out", str(tmp_path / "rel"), "--json"]) == 0
    out = tmp_path / "rel"
    served, source = served_from_folder(out), served_from_folder(resolve_model_dir(trainer_recipe(run_dir)))
    assert served.layout == layouts.DEEPSEEK and served.mtp == []
    assert {n: s.shape for n, s in served.tensors.items()} == {n: s.shape for n, s in source.synced.items()}
    for name, spec in served.tensors.items():
        want = (torch.int64 if name.endswith("tid2eid")
                else torch.float32 if layouts.keeps_fp32(name) else torch.bfloat16)
        assert spec.dtype == want, name
    config = json.loads((out / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 0 and config["torch_dtype"] == "bfloat16"
    loaded = load_tiny_model(out)  # repro's loader: names renamed by transformers, upcast to fp32
    for name, tensor in trainer.model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor.to(loaded.state_dict()[name].dtype)), name
    # the export as the model folder of a new run
    again = EmbeddedTrainer(out, TrainerSettings(dtype="bf16", max_tokens_per_micro_batch=16384, temperature=1.0))
    with torch.no_grad():
        assert torch.equal(again.model(input_ids=IDS, use_cache=False).logits, logits)


def trainer_recipe(run_dir):
    from repro.analysis.frame import read_recipe

    return read_recipe(run_dir / "recipe.yaml")[0]


def test_fp32_export_holds_the_masters_and_slabs_stay_bounded(run_dir, tmp_path, monkeypatch):
    import repro.model.streamed_export as streamed

    masters = load_file(run_dir / "checkpoints" / "step_000003" / "trainer" / "master.safetensors")
    pieces = []
    real = StreamingWriter.write_pieces

    def counting(self, name, slabs):
        def seen():
            for slab in slabs:
                pieces.append((name, slab.numel() * slab.element_size()))
                yield slab
        return real(self, name, seen())

    monkeypatch.setattr(streamed, "SLAB_BYTES", 4096)  # so the experts' tensors go in many slabs
    monkeypatch.setattr(StreamingWriter, "write_pieces", counting)
    out = export_run(run_dir, tmp_path / "fp32", layout="hf", dtype="fp32").folder
    written = load_file(out / "model.safetensors")
    for name, master in masters.items():
        assert written[name].dtype == torch.float32 and torch.equal(written[name], master), name
    stacked = [size for name, size in pieces if name.endswith("gate_up_proj")]
    assert len(stacked) == 4 * 8 * 256 * 128 * 4 // 4096 and max(size for _, size in pieces) <= 4096


def test_model_card_states_recipe_step_and_headline_numbers(run_dir, tmp_path):
    out = export_run(run_dir, tmp_path / "card").folder
    card = (out / "README.md").read_text()
    assert card.startswith("# tiny-cpu: the GRPO policy at step 3\n")
    assert "a mechanism check, not a replication" in card
    assert "step 3 of the recipe's 3" in card and "`builtin:tiny-dsv4-warm`" in card
    assert "| rollout correction | token TIS, cap 2.0 |" in card
    assert "| reward accuracy, steps 1-25 | 45.0% | 50.0% | only 3 of 25 steps logged |" in card
    assert "| held-out avg@k, start | 30.0% | 62.5% |" in card  # 5 of 8
    assert "| held-out avg@k, end | 49.2% | 87.5% (step 3) |" in card  # 7 of 8
    assert "| train-rollout KL, k1 estimator, end | 0.4706 | 0.003 (step 3) |" in card
    assert "| effective sample size, end | 79.1% | 93.0% (step 3) |" in card
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "generation_config.json",
                                                     "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


def test_missing_incomplete_and_existing_are_refused_by_name(run_dir, tmp_path, capsys):
    with pytest.raises(CheckpointError,
                       match=r"step_000002 does not exist \(complete checkpoints of this run: steps \[3\]\)"):
        export_run(run_dir, tmp_path / "a", step=2)
    broken = tmp_path / "broken"
    subprocess.run(["cp", "-r", str(run_dir), str(broken)], check=True)
    (broken / "checkpoints" / "step_000003" / "COMPLETE").unlink()
    with pytest.raises(CheckpointError, match=r"no complete checkpoint"):
        export_run(broken, tmp_path / "a")
    with pytest.raises(CheckpointError, match=r"step_000003 is incomplete \(no COMPLETE\)"):
        export_run(broken, tmp_path / "a", step=3)
    step3 = broken / "checkpoints" / "step_000003"
    (step3 / "COMPLETE").write_text("3")  # a marker from before file digests: not trusted
    with pytest.raises(CheckpointError, match=r"COMPLETE holds the step only \(written before file digests\): "
                                              r"cannot be verified"):
        export_run(broken, tmp_path / "a", step=3)
    seal_checkpoint(step3, 3)
    (step3 / "trainer" / "master.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"master.safetensors is missing"):
        export_run(broken, tmp_path / "a")
    # stand-ins for Megatron trainer states: the embedded one's files rewritten, the folder sealed again so its
    # digests match (what a Megatron run's checkpoint would carry)
    state = step3 / "trainer" / "trainer_state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), "backend": "megatron"}))
    seal_checkpoint(step3, 3)
    with pytest.raises(CheckpointError,
                       match=r"Megatron trainer state \(megatron-core dist_checkpointing.*\).*embedded trainer's"):
        export_run(broken, tmp_path / "a")
    for rank in (0, 1):  # a Megatron world of two: one state folder per rank, nothing at the top
        (step3 / "trainer" / f"rank-{rank:05d}").mkdir()
    state.unlink()
    seal_checkpoint(step3, 3)
    with pytest.raises(CheckpointError, match=r"Megatron trainer state \(the old per-rank format, 2 rank folder\(s\)"):
        export_run(broken, tmp_path / "a")
    assert not (tmp_path / "a").exists()
    taken = tmp_path / "taken"
    taken.mkdir()
    assert main(["export", str(run_dir), "--out", str(taken)]) == 1
    assert f"{taken} already exists" in capsys.readouterr().err
    assert list(taken.iterdir()) == []


def test_a_failure_mid_export_leaves_nothing_under_the_output_name(run_dir, tmp_path, monkeypatch):
    calls = []
    real = StreamingWriter.write_pieces

    def failing(self, name, slabs):
        calls.append(name)
        if len(calls) == 40:
            raise OSError("disk full (injected)")
        return real(self, name, slabs)

    monkeypatch.setattr(StreamingWriter, "write_pieces", failing)
    with pytest.raises(OSError, match="injected"):
        export_run(run_dir, tmp_path / "out", max_shard_bytes=500_000)
    assert list(tmp_path.iterdir()) == []  # neither the output nor its staging folder


def test_sigkill_mid_export_leaves_no_folder_under_the_output_name(run_dir, tmp_path):
    script = (
        "import os, signal, sys\n"
        "from repro.fp8.safetensors_io import StreamingWriter\n"
        "real, seen = StreamingWriter.write_pieces, []\n"
        "def dying(self, name, slabs):\n"
        "    seen.append(name)\n"
        "    if len(seen) == 40: os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return real(self, name, slabs)\n"
        "StreamingWriter.write_pieces = dying\n"
        "from repro.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", script, "export", str(run_dir), "--out", str(out),
                           "--max-shard-size", "500KB"], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert not out.exists()
    left = [p.name for p in tmp_path.iterdir()]  # a killed process cleans nothing: its hidden staging folder stays
    assert len(left) == 1 and left[0].startswith(".out.tmp-") and not (tmp_path / left[0] / "config.json").exists()


def test_write_pieces_refuses_pieces_that_do_not_fill_the_tensor(tmp_path):
    writer = StreamingWriter(tmp_path / "x.safetensors", [("a", torch.float32, (2, 3))], direct=False)
    with pytest.raises(RuntimeError, match="pieces held 16 of its 24 bytes"):
        writer.write_pieces("a", [torch.ones(4)])
    writer.abort()
    writer = StreamingWriter(tmp_path / "y.safetensors", [("a", torch.float32, (2, 3))], direct=False)
    writer.write_pieces("a", [torch.arange(4.0), torch.arange(4.0, 6.0)])
    writer.close()
    assert torch.equal(load_file(tmp_path / "y.safetensors")["a"], torch.arange(6.0).reshape(2, 3))
