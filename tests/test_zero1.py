"""ZeRO-1 (repro.train.zero1): two real gloo ranks, each stepping AdamW on the parameters it owns, end with the
very weights and optimizer state the unsharded MasterAdamW reaches -- compared bit for bit, over several steps,
with gradient clipping active on some of them, for an fp32 model (masters are the parameters) and a bf16 one
(fp32 masters are sharded copies)."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from repro.recipes.schema import OptimConfig
from repro.train.optimizer import MasterAdamW
from repro.train.zero1 import ShardedMasterAdamW, partition_by_size

OPTIM = OptimConfig(lr=1e-2, betas=[0.9, 0.98], eps=1e-8, weight_decay=0.1, grad_clip=1.0)
STEPS = 5
DTYPES = ("float32", "bfloat16")
# sizes chosen so that the greedy split is uneven and no tensor is a multiple of a SIMD width
SHAPES = {"embed": (37, 9), "attn": (9, 9), "experts": (4, 9, 13), "norm": (9,), "head": (9, 37)}


def build_model(dtype: torch.dtype) -> torch.nn.Module:
    model = torch.nn.Module()
    generator = torch.Generator().manual_seed(0)
    for name, shape in SHAPES.items():
        model.register_parameter(name, torch.nn.Parameter(torch.randn(shape, generator=generator).to(dtype)))
    return model


def set_gradients(model: torch.nn.Module, step: int) -> None:
    """The same hand-built gradient on every rank; even steps are large enough that the clip at 1.0 acts."""
    generator = torch.Generator().manual_seed(100 + step)
    scale = 3.0 if step % 2 == 0 else 0.01
    for p in model.parameters():
        p.grad = (scale * torch.randn(p.shape, generator=generator)).to(p.dtype)


def _rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for dtype_name in DTYPES:
            _run_rank(rank, dtype_name, out_dir)
        # expert-like parameters replicated over a group of their own (as megatron's expert-data-parallel group)
        experts = dist.new_group([0, 1])
        _run_rank(rank, "float32", out_dir, tag="two-groups",
                  group_of=lambda name: experts if name == "experts" else None)
    finally:
        dist.destroy_process_group()


def _run_rank(rank: int, dtype_name: str, out_dir: str, tag: str = "", group_of=None) -> None:
    model = build_model(getattr(torch, dtype_name))
    opt = ShardedMasterAdamW(model, OPTIM, group_of=group_of)
    norms = []
    for step in range(STEPS):
        set_gradients(model, step)
        norms.append(opt.step(lr=OPTIM.lr * (step + 1) / STEPS))
    states = (opt.optimizer.state[m] for m in opt.master)
    moments = {f"{name}.{key}": value for name, state in zip(opt.owned_names, states)
               for key, value in state.items() if key in ("exp_avg", "exp_avg_sq")}
    masters = {f"{name}.master": m for name, m in opt.master_state().items()}
    weights = {f"{name}.weight": p.detach() for name, p in model.named_parameters()}
    save_file({**weights, **moments, **masters, "norms": torch.tensor(norms, dtype=torch.float64),
               "state_bytes": torch.tensor([opt.state_bytes()])},
              os.path.join(out_dir, f"{tag or dtype_name}-rank{rank}.safetensors"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unsharded(dtype: torch.dtype):
    model = build_model(dtype)
    opt = MasterAdamW(model, OPTIM)
    norms = []
    for step in range(STEPS):
        set_gradients(model, step)
        norms.append(opt.step(lr=OPTIM.lr * (step + 1) / STEPS))
    return model, opt, norms


def test_partition_is_greedy_by_size_and_deterministic():
    # largest first: 50 -> r0; 30 -> r1; 20 -> r1 (30 < 50); 10 -> r0 (a 50/50 tie goes to the lower rank)
    assert partition_by_size([10, 50, 20, 30], 2) == [0, 0, 1, 1]
    assert partition_by_size([5, 5, 5], 4) == [0, 1, 2]
    assert partition_by_size([7], 1) == [0]


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory):
    """Both dtypes' runs on one pair of spawned gloo ranks (process start-up dominates the test's time)."""
    out = tmp_path_factory.mktemp("zero1")
    mp.start_processes(_rank_main, args=(2, _free_port(), str(out)), nprocs=2, join=True, start_method="spawn")
    return out


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_two_gloo_ranks_match_the_unsharded_update_bit_for_bit(two_rank_results, dtype_name):
    dtype = getattr(torch, dtype_name)
    ranks = [load_file(two_rank_results / f"{dtype_name}-rank{r}.safetensors") for r in range(2)]
    model, opt, norms = unsharded(dtype)
    sizes = [p.numel() for p in model.parameters()]
    # every rank ends with the whole model, equal to the unsharded one in every bit
    for got in ranks:
        for name, p in model.named_parameters():
            assert torch.equal(got[f"{name}.weight"], p.detach()), name
        assert got["norms"].tolist() == norms
    assert norms[0] > OPTIM.grad_clip and norms[1] < OPTIM.grad_clip  # clipping acted on even steps only
    # each parameter's moments (and fp32 master) live on exactly one rank and equal the unsharded ones
    reference = {name: opt.optimizer.state[m] for name, m in zip(opt.names, opt.master)}
    owners = partition_by_size(sizes, 2)
    for index, name in enumerate(opt.names):
        holder = ranks[owners[index]]
        other = ranks[1 - owners[index]]
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(holder[f"{name}.{key}"], reference[name][key]), (name, key)
            assert f"{name}.{key}" not in other
        if dtype == torch.bfloat16:
            assert torch.equal(holder[f"{name}.master"], opt.master_state()[name])
    # the state each rank holds: 8 bytes a parameter (two fp32 moments), +4 for its fp32 master under bf16
    per_param = 8 if dtype == torch.float32 else 12
    owned = [sum(s for s, o in zip(sizes, owners) if o == r) for r in range(2)]
    assert [int(r["state_bytes"]) for r in ranks] == [per_param * n for n in owned]
    assert sum(owned) == sum(sizes) == 333 + 81 + 468 + 9 + 333


def test_parameters_replicated_over_another_group_are_sharded_within_it(two_rank_results):
    ranks = [load_file(two_rank_results / f"two-groups-rank{r}.safetensors") for r in range(2)]
    model, opt, norms = unsharded(torch.float32)
    for got in ranks:
        for name, p in model.named_parameters():
            assert torch.equal(got[f"{name}.weight"], p.detach()), name
    # "experts" alone in its group: rank 0 owns it; the other four split over the default group by size
    owned = [{key.rsplit(".", 1)[0] for key in r if key.endswith(".exp_avg")} for r in ranks]
    others = [n for n in SHAPES if n != "experts"]
    split = partition_by_size([model.get_parameter(n).numel() for n in others], 2)
    assert owned[0] == {"experts"} | {n for n, r in zip(others, split) if r == 0}
    assert owned[1] == {n for n, r in zip(others, split) if r == 1}
