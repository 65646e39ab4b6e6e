"""Padding a TrainBatch (sequence-parallel widths, data-parallel lockstep): exact contents, nothing learned from
pads."""

from __future__ import annotations

import pytest
import torch

from repro.errors import ReproError
from repro.train.batch import TrainBatch, padded_to_multiple, padded_to_shape


def small_batch() -> TrainBatch:
    return TrainBatch(
        input_ids=torch.tensor([[5, 6, 7], [8, 9, 4]]),
        targets=torch.tensor([[6, 7, 2], [9, 4, 2]]),
        response_mask=torch.tensor([[False, True, True], [False, False, True]]),
        rollout_logprobs=torch.tensor([[0.0, -0.5, -1.0], [0.0, 0.0, -2.0]]),
        advantages=torch.tensor([1.5, -0.5]),
        routing={0: torch.tensor([[[1, 2], [3, 4], [5, 6]], [[7, 0], [1, 3], [2, 4]]])},
        old_logprobs=torch.tensor([[0.0, -0.4, -1.1], [0.0, 0.0, -2.2]]),
    )


def test_padded_to_shape_keeps_every_value_and_pads_with_off_response_zeros():
    batch = small_batch()
    padded = padded_to_shape(batch, 3, 5)
    assert padded.input_ids.tolist() == [[5, 6, 7, 0, 0], [8, 9, 4, 0, 0], [0, 0, 0, 0, 0]]
    assert padded.response_mask.tolist() == [[False, True, True, False, False], [False, False, True, False, False],
                                             [False] * 5]
    assert padded.advantages.tolist() == [1.5, -0.5, 0.0]
    assert padded.routing[0].shape == (3, 5, 2) and padded.routing[0][1, 2].tolist() == [2, 4]
    assert int(padded.routing[0][:, 3:].abs().sum()) == 0
    assert padded.old_logprobs[0].tolist() == pytest.approx([0.0, -0.4, -1.1, 0.0, 0.0])
    assert padded.input_ids.dtype == torch.int64 and padded.response_mask.dtype == torch.bool


def test_padded_to_multiple_rounds_the_width_up_and_leaves_a_fitting_batch_alone():
    batch = small_batch()
    assert padded_to_multiple(batch, 4).input_ids.shape == (2, 4)
    assert padded_to_multiple(batch, 3) is batch
    with pytest.raises(ReproError, match=r"cannot shrink \[2, 3\] to \[1, 3\]"):
        padded_to_shape(batch, 1, 3)
