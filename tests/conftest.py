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
