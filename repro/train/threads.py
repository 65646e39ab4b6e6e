"""The embedded trainer's rows split over Python threads, each on its own copy of the model's modules.

Why threads pay on a CPU: torch releases the GIL inside every op, and autograd runs a CPU backward in the thread
that called it, so two threads that each forward and backward half of a batch with one intra-op thread each
keep two cores busy (the tiny DeepSeek-V4's BF16 forward + backward of 256 x 18 tokens: 0.77-0.94 s on one
thread, 0.49-0.59 s on two). The RL loop runs one phase at a time, so during the update the rollout worker's
core is idle. Intra-op threads do not give this: the model is bound by its ~7,600 small ops per forward +
backward, and forking a pool for each of them costs more than it saves.

Why copies of the modules: routing replay hooks the router modules of the model it replays on, and a parameter
has one ``.grad``. Each thread's copy has its own modules, hooks and gradients, and views of the same weights,
which nothing writes while the threads run (the optimizer steps after they have joined, in place).

Determinism: the split is a function of the batch alone, each thread's work is fixed, and the copies' gradients
are added into the model's in thread order, so a run gives the same numbers every time (though not bit for bit
those of one thread: a forward rounds according to its micro-batch's shape, and the halves' gradients are added
once more).
"""

from __future__ import annotations

import copy
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import torch

Job = Callable[[torch.nn.Module], None]
PRIMITIVE_CACHE_CAPACITY = "1024"  # oneDNN's default, written down: it holds a run's padded shapes (worker_thread_env)


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, which a container or taskset narrows), not the
    machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no affinity call
        return os.cpu_count() or 1


def worker_thread_env(threads: int) -> dict[str, str]:
    """A CPU worker's thread settings: ``threads`` intra-op threads (at most the cores it may use). The workers
    take turns (rollout, then trainer, then sync), so each may use every core while its phase runs; OpenMP's
    idle threads spin by default, though, which would steal the cores from the other worker's phase, so with more
    than one thread they are told to sleep instead.

    oneDNN's primitive cache (BF16 matmuls) holds ``PRIMITIVE_CACHE_CAPACITY`` (the user's
    ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` wins): the trainer's GEMMs run at a few padded row counts
    (``repro.train.stable_shapes``), and 25 in-process tiny steps made 1,239 primitives in all at 1,024 (2,048: 1,231;
    512: 1,615; 256: 2,242) -- after the first steps only the attention's and hyper-connections' batched matmuls,
    whose shapes follow each micro-batch's rows and width, are new. RSS at the end: 2,049 MiB at 1,024, 1,990 at 512."""
    threads = max(1, min(threads, usable_cores()))
    env = {"OMP_NUM_THREADS": str(threads),
           "ONEDNN_PRIMITIVE_CACHE_CAPACITY": os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY",
                                                             PRIMITIVE_CACHE_CAPACITY)}
    if threads > 1:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env


def use_worker_threads(threads: int) -> dict[str, str]:
    """This process set up as a CPU worker (``worker_thread_env``): for ``--in-process`` runs, so that they compute
    with the threads the Ray workers use: torch's intra-op threads are set now, the rest of the environment where
    the user has not set it; returns the settings in force."""
    env = worker_thread_env(threads)
    for key, value in env.items():
        os.environ.setdefault(key, value)
    torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    return {**{key: os.environ[key] for key in env}, "OMP_NUM_THREADS": env["OMP_NUM_THREADS"]}


def balanced_shares(rows: torch.Tensor, widths: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """Split [R] row indices, in order, into at most ``parts`` non-empty consecutive shares of about equal total
    width ([R] int widths of those rows): share i ends at the first row whose running width reaches
    (i + 1) / parts of the total."""
    if len(rows) == 0:
        return []
    running = torch.cumsum(widths.to(torch.float64), dim=0)
    total = float(running[-1])
    bounds = [int(torch.searchsorted(running, total * (i + 1) / parts)) + 1 for i in range(parts - 1)]
    edges = sorted({0, *[min(b, len(rows)) for b in bounds], len(rows)})
    return [rows[a:b] for a, b in zip(edges, edges[1:]) if b > a]


class ThreadedReplicas:
    """``threads`` copies of ``model`` (the first is ``model`` itself) sharing its parameters and buffers, and a
    pool that runs one list of jobs per copy, each list on its own thread."""

    def __init__(self, model: torch.nn.Module, threads: int):
        if threads < 1:
            raise ValueError(f"update threads must be >= 1, got {threads}")
        self.models = [model] + [copy.deepcopy(model) for _ in range(threads - 1)]
        self.pool = ThreadPoolExecutor(threads - 1, thread_name_prefix="update") if threads > 1 else None
        self._share_weights()  # the copies' own weight tensors are freed at once, not at the first run

    @property
    def threads(self) -> int:
        return len(self.models)

    def _share_weights(self) -> None:
        """Point every copy's parameters and buffers at the model's (again, if a load replaced a tensor)."""
        first = self.models[0]
        for replica in self.models[1:]:
            for own, theirs in zip(first.parameters(), replica.parameters()):
                if theirs.data_ptr() != own.data_ptr() or theirs.shape != own.shape:
                    theirs.data = own.data
                theirs.grad = None
            for own, theirs in zip(first.buffers(), replica.buffers()):
                if theirs.data_ptr() != own.data_ptr():
                    theirs.data = own.data

    def run(self, work: list[list[Job]]) -> None:
        """Run ``work[i]``'s jobs in order on copy i, copy 0's in the calling thread; waits for every thread
        before raising the first error (in thread order)."""
        if len(work) > self.threads:
            raise ValueError(f"{len(work)} job lists for {self.threads} threads")
        self._share_weights()

        def run_list(index: int) -> None:
            for job in work[index]:
                job(self.models[index])

        futures = [self.pool.submit(run_list, i) for i in range(1, len(work))]
        errors = []
        try:
            if work:
                run_list(0)
        except BaseException as error:  # noqa: BLE001 - re-raised below, after the other threads are done
            errors.append(error)
        for future in futures:
            error = future.exception()
            if error is not None:
                errors.append(error)
        if errors:
            raise errors[0]

    def add_gradients_into_model(self) -> None:
        """model.grad += each copy's .grad, copy by copy (a copy whose parameter got none adds nothing)."""
        first = self.models[0]
        with torch.no_grad():
            for replica in self.models[1:]:
                for own, theirs in zip(first.parameters(), replica.parameters()):
                    if theirs.grad is None:
                        continue
                    if own.grad is None:
                        own.grad = theirs.grad
                    else:
                        own.grad.add_(theirs.grad)
                    theirs.grad = None
