"""Shared by the algorithm tests (test_algos.py, test_algos_rollout_correction.py): exact float64 inputs."""

import math

import torch

LN2 = math.log(2.0)
D = torch.float64


def t(values, dtype=D):
    return torch.tensor(values, dtype=dtype)
