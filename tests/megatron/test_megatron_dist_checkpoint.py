"""Megatron trainer state through megatron.core.dist_checkpointing, run for real on gloo/CPU: resume bit for bit
(RNG included), a TP 2 checkpoint resharded onto TP 1, the old per-rank format still resumed, and a DCP
``.metadata`` that would run code refused before DCP unpickles it."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed here: "
                                            "`make test-megatron` runs this lane in .venv-megatron")

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from repro.recipes import load_recipe  # noqa: E402
from repro.train.base import TrainerError  # noqa: E402
from repro.train.batch import TrainBatch  # noqa: E402
from repro.train.megatron.trainer import MegatronTrainer  # noqa: E402
from test_megatron_contract import make_megatron_batch, one_thread  # noqa: E402,F401

BASE = ["actor.dtype=fp32", "actor.backend=megatron", "actor.model_provider=repro.train.megatron.tiny:provider",
        "actor.max_tokens_per_micro_batch=40", "optim.lr=0.001", "optim.grad_clip=0.05", "seed=3"]
TP2 = BASE + ["actor.num_workers=2", "actor.tensor_parallel=2", "actor.sequence_parallel=true"]


def _batch_tensors(batch: TrainBatch) -> dict[str, torch.Tensor]:
    fields = {k: getattr(batch, k) for k in ("input_ids", "targets", "response_mask", "rollout_logprobs",
                                             "advantages", "old_logprobs")}
    return {**fields, **{f"routing.{layer}": t for layer, t in batch.routing.items()}}


def _batch_from(tensors: dict[str, torch.Tensor]) -> TrainBatch:
    routing = {int(k.split(".")[1]): t for k, t in tensors.items() if k.startswith("routing.")}
    return TrainBatch(tensors["input_ids"], tensors["targets"], tensors["response_mask"], tensors["rollout_logprobs"],
                      tensors["advantages"], routing, tensors["old_logprobs"])


def _trained(recipe_sets, seed=5):
    trainer = MegatronTrainer.from_recipe(load_recipe("tiny-cpu", recipe_sets))
    batch = make_megatron_batch(trainer.model, seed=seed)
    batch.old_logprobs = trainer.logprobs(batch).logprobs
    trainer.train_step(batch)
    return trainer, batch


def _same_parameters(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_resume_is_bit_identical_and_restores_the_rng(tmp_path, dtype):
    sets = BASE + ["actor.num_workers=1", f"actor.dtype={dtype}"]
    trainer, batch = _trained(sets)
    folder = trainer.save(tmp_path / "state")
    assert sorted(p.name for p in folder.iterdir()) == ["dist", "trainer_state.json"]
    saved_rng = torch.get_rng_state()
    resumed = MegatronTrainer.from_recipe(load_recipe("tiny-cpu", sets))
    torch.rand(7)  # the RNG moves on; load puts it back
    resumed.load(folder)
    assert torch.equal(torch.get_rng_state(), saved_rng) and resumed.resharded_from is None
    assert (resumed.step, resumed.updates) == (trainer.step, trainer.updates) == (1, 1)
    assert _same_parameters(trainer, resumed)
    continued, again = trainer.train_step(batch), resumed.train_step(batch)
    assert continued == again and _same_parameters(trainer, resumed)


def _tp2_rank(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from repro.train.megatron.parallel import init_distributed_from_env

    init_distributed_from_env()
    trainer = MegatronTrainer.from_recipe(load_recipe("tiny-cpu", TP2))
    batch = _batch_from(load_file(os.path.join(out, "batch.safetensors")))
    trainer.train_step(batch)
    trainer.save(os.path.join(out, "tp2"))
    saved = dict(trainer.named_weights())  # full weights on rank 0 (collective)
    second = trainer.train_step(batch)
    after = dict(trainer.named_weights())
    if rank == 0:
        save_file({**{f"saved.{k}": v for k, v in saved.items()}, **{f"after.{k}": v for k, v in after.items()},
                   "loss": torch.tensor([second["actor/loss"]], dtype=torch.float64)},
                  os.path.join(out, "tp2_weights.safetensors"))


def test_tp2_checkpoint_reshards_onto_tp1(tmp_path):
    from megatron.core.dist_checkpointing import load_plain_tensors

    one = BASE + ["actor.num_workers=1"]
    reference = MegatronTrainer.from_recipe(load_recipe("tiny-cpu", one))
    batch = make_megatron_batch(reference.model, seed=5)
    batch.old_logprobs = reference.logprobs(batch).logprobs
    save_file(_batch_tensors(batch), tmp_path / "batch.safetensors")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_tp2_rank, args=(port, str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    tp2 = load_file(tmp_path / "tp2_weights.safetensors")

    resumed = MegatronTrainer.from_recipe(load_recipe("tiny-cpu", one))
    resumed.load(tmp_path / "tp2")
    assert resumed.resharded_from["tensor_model_parallel_size"] == 2 and resumed.resharded_from["world_size"] == 2
    assert resumed.step == 1
    weights = dict(resumed.named_weights())
    assert weights.keys() == {k.removeprefix("saved.") for k in tp2 if k.startswith("saved.")}
    for name, w in weights.items():  # resharding only slices and joins: bit for bit
        assert torch.equal(w, tp2[f"saved.{name}"]), name
    # every global tensor -- weights, AdamW moments -- comes back out of a TP 1 save exactly as TP 2 wrote it
    resumed.save(tmp_path / "tp1")
    written, rewritten = (load_plain_tensors(str(tmp_path / "tp2" / "dist")),
                          load_plain_tensors(str(tmp_path / "tp1" / "dist")))
    state_keys = {k for k in written if not k.startswith("rng.")}
    assert state_keys == {k for k in rewritten if not k.startswith("rng.")}
    assert any(k.startswith("optimizer.exp_avg_sq.") for k in state_keys)
    for key in state_keys:
        assert torch.equal(written[key], rewritten[key]), key
    # the next update on TP 1 is TP 2's but for the order of float reductions
    second = resumed.train_step(batch)
    assert second["actor/loss"] == pytest.approx(float(tp2["loss"]), rel=1e-5)
    worst = max(float((w - tp2[f"after.{n}"]).abs().max()) for n, w in resumed.named_weights())
    assert worst < 1e-6, worst
    print(f"\nTP2 -> TP1 next step: loss {second['actor/loss']!r} vs {float(tp2['loss'])!r}, max |dw| {worst:.3g}")


def _old_format_save(trainer, directory: Path) -> None:
    """What MegatronTrainer.save wrote before dist checkpoints (format 1, world size 1)."""
    from repro.train.megatron.model import weight_state
    from repro.train.trainer_state import save_trainer

    view = SimpleNamespace(model=trainer.model, opt=trainer.opt.inner, dtype_name=trainer.dtype_name,
                           step=trainer.step, updates=trainer.updates, bf16_gemm=None)
    save_trainer(view, directory, backend="megatron", weights=weight_state(trainer.model), hf_config=False)


def test_the_old_per_rank_format_still_resumes_bit_for_bit(tmp_path):
    sets = BASE + ["actor.num_workers=1", "actor.dtype=bf16"]
    trainer, batch = _trained(sets)
    _old_format_save(trainer, tmp_path / "old")
    resumed = MegatronTrainer.from_recipe(load_recipe("tiny-cpu", sets))
    resumed.load(tmp_path / "old")
    assert (resumed.step, resumed.updates) == (1, 1)
    continued, again = trainer.train_step(batch), resumed.train_step(batch)
    assert continued == again and _same_parameters(trainer, resumed)


def test_unloadable_folders_are_refused_naming_them(tmp_path):
    trainer = MegatronTrainer.from_recipe(load_recipe("tiny-cpu", BASE + ["actor.num_workers=1"]))
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrainerError, match=f"{tmp_path / 'empty'}: no Megatron trainer state"):
        trainer.load(tmp_path / "empty")
    for rank in range(2):  # an old-format state of two ranks cannot be resharded onto one
        (tmp_path / "two" / f"rank-{rank:05d}").mkdir(parents=True)
    with pytest.raises(TrainerError, match=f"{tmp_path / 'two'}: per-rank state .* of 2 rank"):
        trainer.load(tmp_path / "two")


def _pickle_calling(module: str, name: str, argument: str) -> bytes:
    """Protocol-4 pickle bytes that call ``module.name(argument)`` when unpickled (never unpickled here)."""
    m, n, a = (x.encode() for x in (module, name, argument))
    return (b"\x80\x04\x8c" + bytes([len(m)]) + m + b"\x8c" + bytes([len(n)]) + n + b"\x93\x8c" + bytes([len(a)]) + a
            + b"\x85R.")


@pytest.mark.parametrize("module,name", [("os", "system"), ("torch.distributed.checkpoint.filesystem", "os.system")])
def test_a_metadata_file_that_would_run_code_is_refused_before_dcp_reads_it(tmp_path, module, name):
    sets = BASE + ["actor.num_workers=1"]
    trainer, _ = _trained(sets)
    folder = trainer.save(tmp_path / "state")
    marker = tmp_path / "ran"
    (folder / "dist" / ".metadata").write_bytes(_pickle_calling(module, name, f"touch {marker}"))
    with pytest.raises(TrainerError, match=r"dist/\.metadata: refused"):
        trainer.load(folder)
    assert not marker.exists()


def test_a_state_saved_in_another_optimizer_format_is_refused_naming_both(tmp_path):
    """The optimizer's checkpoint format is recorded (on a GPU megatron's fully_reshardable; here the project's
    AdamW's): a state whose record names another format, e.g. an older dp_reshardable one that reshards only in
    DP, is refused before DCP reads anything, naming the file and both formats."""
    import json

    sets = BASE + ["actor.num_workers=1"]
    trainer, _ = _trained(sets)
    folder = trainer.save(tmp_path / "state")
    meta = json.loads((folder / "trainer_state.json").read_text())
    assert meta["optimizer_format"] == trainer.opt.checkpoint_format
    meta["optimizer_format"] = "dp_reshardable"
    (folder / "trainer_state.json").write_text(json.dumps(meta))
    with pytest.raises(TrainerError, match=(
            rf"{folder / 'trainer_state.json'}: optimizer state saved as 'dp_reshardable', this trainer reads "
            rf"'{trainer.opt.checkpoint_format}'")):
        trainer.load(folder)
