"""MegatronTrainer at DP 2 steps ZeRO-1 (repro.train.zero1): two real gloo ranks each keep the Adam state of half
the parameters, end every update with the same weights, and a checkpoint of each rank's shard resumes to the
bit-identical next step. (test_megatron_ranks.py checks the DP 2 numbers against one process.)"""

from __future__ import annotations

import os
import socket

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed here: "
                                            "`make test-megatron` runs this lane in .venv-megatron")

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

BASE = ["actor.dtype=fp32", "actor.backend=megatron", "actor.model_provider=repro.train.megatron.tiny:provider",
        "actor.num_workers=2", "actor.max_tokens_per_micro_batch=40", "optim.lr=0.001", "optim.grad_clip=0.05",
        "seed=3"]


def _rank_main(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from repro.recipes import load_recipe
    from repro.train.megatron.parallel import init_distributed_from_env
    from repro.train.megatron.trainer import MegatronTrainer
    from repro.train.zero1 import ShardedMasterAdamW
    from test_megatron_contract import make_megatron_batch

    init_distributed_from_env()
    recipe = load_recipe("tiny-cpu", BASE)
    trainer = MegatronTrainer.from_recipe(recipe)
    assert isinstance(trainer.opt.inner, ShardedMasterAdamW)
    batch = make_megatron_batch(trainer.model, seed=5)
    batch.old_logprobs = trainer.logprobs(batch).logprobs
    trainer.train_step(batch)
    trainer.save(os.path.join(out, "ckpt"))
    resumed = MegatronTrainer.from_recipe(recipe)
    resumed.load(os.path.join(out, "ckpt"))
    continued_metrics, resumed_metrics = trainer.train_step(batch), resumed.train_step(batch)
    tensors = {f"continued.{n}": p.detach() for n, p in trainer.model.named_parameters()}
    tensors.update({f"resumed.{n}": p.detach() for n, p in resumed.model.named_parameters()})
    tensors["state_bytes"] = torch.tensor([trainer.opt.inner.state_bytes()])
    tensors["loss"] = torch.tensor([continued_metrics["actor/loss"], resumed_metrics["actor/loss"]],
                                   dtype=torch.float64)
    save_file(tensors, os.path.join(out, f"rank{rank}.safetensors"),
              metadata={"owned": ",".join(trainer.opt.inner.owned_names), "all": ",".join(trainer.opt.names)})


def test_dp2_megatron_ranks_shard_adam_state_and_resume_bit_for_bit(tmp_path):
    from safetensors import safe_open

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank_main, args=(port, str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    ranks, owned = [], []
    for r in range(2):
        path = tmp_path / f"rank{r}.safetensors"
        ranks.append(load_file(path))
        with safe_open(path, "pt") as f:
            meta = f.metadata()
        owned.append(set(meta["owned"].split(",")) - {""})
        names = meta["all"].split(",")
    # each parameter's Adam state on exactly one rank; together, 8 bytes (two fp32 moments) per parameter
    assert owned[0].isdisjoint(owned[1]) and owned[0] | owned[1] == set(names)
    numel = {n: ranks[0][f"continued.{n}"].numel() for n in names}
    assert [int(r["state_bytes"]) for r in ranks] == [8 * sum(numel[n] for n in o) for o in owned]
    assert min(int(r["state_bytes"]) for r in ranks) > 0
    for name in names:  # all-gathered: both replicas hold the same weights; the resumed run is the continued one
        assert torch.equal(ranks[0][f"continued.{name}"], ranks[1][f"continued.{name}"]), name
        for r in ranks:
            assert torch.equal(r[f"continued.{name}"], r[f"resumed.{name}"]), name
    for r in ranks:
        assert r["loss"][0] == r["loss"][1]
