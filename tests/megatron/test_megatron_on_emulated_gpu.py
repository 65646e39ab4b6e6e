"""MegatronTrainer with its model on a GPU, on this CPU: every micro-batch, collective and synced weight where a
GPU rank needs it. STAND-IN: the GPU and NCCL are tests/standins/emulated_cuda.py's -- device tensors hold CPU data
and report another device, an op mixing them with host tensors raises CUDA's error, a collective given a host tensor
raises ProcessGroupNCCL's, gloo carries the bytes. The optimizer stays the project's AdamW (megatron's cannot be
built without CUDA: test_megatron_optimizer.py) and megatron-core runs under repro's CPU shim. Not covered: NCCL
itself, streams, device memory, CUDA kernels' numerics (every value is computed by the CPU, so it must equal a CPU
run's bit for bit).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core",
                    reason="megatron-core is not installed here: `make test-megatron` runs this lane in .venv-megatron")

import torch  # noqa: E402

from repro.recipes.schema import OptimConfig  # noqa: E402
from repro.train.megatron.tiny import build_tiny_gpt_moe  # noqa: E402
from repro.train.megatron.trainer import MegatronTrainer  # noqa: E402
from repro.train.grpo_update import TrainerSettings  # noqa: E402
from test_megatron_contract import MODEL_SEED, make_megatron_batch, one_thread  # noqa: E402,F401

STANDINS = Path(__file__).resolve().parents[1] / "standins"
sys.path.insert(0, str(STANDINS))
from emulated_cuda import emulated_cuda, is_on_device  # noqa: E402


def _trainer(model) -> MegatronTrainer:
    return MegatronTrainer(model, TrainerSettings(dtype="fp32", max_tokens_per_micro_batch=16384, temperature=0.8,
                                                  optim=OptimConfig(lr=1e-3, weight_decay=0.0)))


def _fresh_buffers() -> None:
    """megatron's global scratch buffer is allocated once per process on the first device asked for: a CPU run
    before the GPU one would leave a host buffer behind (a GPU process never has one)."""
    from megatron.core import parallel_state

    parallel_state.destroy_global_memory_buffer()
    parallel_state._set_global_memory_buffer()


def test_a_gpu_rank_scores_updates_and_streams_what_the_cpu_rank_does():
    """Before the trainer moved each micro-batch to its model's device, the first forward failed on the host
    input ids (emulated: "Expected all tensors to be on the same device ... (aten::embedding)")."""
    cpu = _trainer(build_tiny_gpt_moe(seed=MODEL_SEED))
    batch = make_megatron_batch(cpu.model)
    want_lp = cpu.logprobs(batch)
    batch.old_logprobs = want_lp.logprobs.clone()
    want_metrics = cpu.train_step(batch)
    want_weights = dict(cpu.named_weights())

    _fresh_buffers()
    model = build_tiny_gpt_moe(seed=MODEL_SEED)  # built on the host, as the tiny providers do (CPU initialisation)
    try:
        with emulated_cuda():
            gpu = _trainer(model.to("cuda"))  # what MegatronTrainer does with it on a GPU rank
            assert all(is_on_device(p) for p in gpu.model.parameters())
            got_lp = gpu.logprobs(batch)  # a host batch, as the loop hands it over
            metrics = gpu.train_step(batch)
            synced = [(name, is_on_device(t), t.cpu()) for name, t in gpu.sync_weights()]
            exported = dict(gpu.named_weights())
    finally:
        _fresh_buffers()
    assert not is_on_device(got_lp.logprobs) and torch.equal(got_lp.logprobs, want_lp.logprobs)
    assert torch.equal(got_lp.entropy, want_lp.entropy)
    assert metrics == want_metrics  # the CPU computes every value: bit for bit
    # the sync's tensors stay on the GPU (packed there for NCCL); the export's come to the host
    assert synced and all(on_gpu for _, on_gpu, _ in synced)
    assert all(torch.equal(t, want_weights[name]) for name, _, t in synced)
    assert not any(is_on_device(t) for t in exported.values())
    assert all(torch.equal(exported[name], w) for name, w in want_weights.items())


def _data_parallel_rank(rank: int, port: int, results) -> None:
    """One of two data-parallel ranks of an emulated-GPU world: lockstep micro-batches and the summed stats."""
    sys.path.insert(0, str(STANDINS))
    import torch.distributed as dist
    from megatron.core import parallel_state

    from emulated_cuda import emulated_cuda
    from repro.train.batch import micro_batches
    from repro.train.grpo_update import UpdateStats
    from repro.train.megatron.cpu_shim import install_cpu_shim
    from repro.train.megatron.parallel import lockstep_over_data_parallel, sum_over_data_parallel

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        install_cpu_shim()
        parallel_state.initialize_model_parallel(1, 1)
        model = build_tiny_gpt_moe(seed=MODEL_SEED)
        batch = make_megatron_batch(model)
        mine = batch.rows(torch.arange(batch.num_rows).tensor_split(2)[rank])
        with emulated_cuda():
            micros = lockstep_over_data_parallel(micro_batches(mine, 12 + 20 * rank), batch)
            stats = sum_over_data_parallel(UpdateStats(loss=1.5 + rank, tokens=10.0 * (rank + 1), micro_batches=1,
                                                       update_tokens=70.0, rows_skipped=3))
        results.put((rank, [tuple(m.input_ids.shape) for m in micros], stats.loss, stats.tokens, stats.micro_batches,
                     (stats.update_tokens, stats.rows_skipped)))
    except Exception as err:  # reported to the test
        results.put((rank, f"{type(err).__name__}: {err}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_data_parallel_replicas_agree_on_micro_batches_and_sum_their_stats_on_the_device():
    """Two DP ranks, each with its own rows and token budget: both run the busier one's count of micro-batches at
    the largest shape of each index, and add their sums -- with every collective on device tensors. Before, the
    counters were host tensors and the emulated NCCL refused them ("Tensors must be CUDA and dense")."""
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.Queue()
    env = dict(os.environ)
    procs = [context.Process(target=_data_parallel_rank, args=(rank, port, results)) for rank in (0, 1)]
    try:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
        for p in procs:
            p.start()
        got = sorted(results.get(timeout=240) for _ in procs)
    finally:
        os.environ.clear()
        os.environ.update(env)
        for p in procs:
            p.join(30)
    assert all(len(r) == 6 for r in got), got
    (_, shapes0, loss0, tokens0, micro0, plan0), (_, shapes1, loss1, tokens1, micro1, plan1) = got
    assert shapes0 == shapes1 and len(shapes0) >= 2  # rank 0's smaller budget gives it more micro-batches
    assert (loss0, tokens0, micro0) == (loss1, tokens1, micro1) == (4.0, 30.0, 2)
    assert plan0 == plan1 == (70.0, 3)  # the plan's whole-batch counts (UpdateStats.WHOLE_BATCH) are not summed
