"""Fixtures shared by several test modules."""

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for the module: the tiny model's ops are so small that, with other processes on the
    2 cores, OpenMP's second thread spins and makes each forward several times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def fault_baseline(tmp_path_factory):
    """The uninterrupted 10-step run of tests/run_faults_support.FAULT_RUN that the fault tests compare with;
    returns its log's rows. It runs in this process on one torch thread, as the fault tests' runs do: then its
    numbers are the Ray run's bit for bit (each CPU worker has one thread); on two threads they part from step 7
    on, in the last bits (float reductions split another way)."""
    from run_faults_support import BASELINE_STEPS, FAULT_RUN, log_rows

    from repro.recipes import load_recipe
    from repro.engines import run_recipe

    run_dir = tmp_path_factory.mktemp("fault-baseline")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_recipe(load_recipe("tiny-cpu", FAULT_RUN, steps=BASELINE_STEPS), run_dir, in_process=True)
    finally:
        torch.set_num_threads(before)
    return log_rows(run_dir)
