"""A fault a user (or the device check) can inject into a real run, to see the trainer refuse it.

``REPRO_FAULT_NAN_GRADIENT_AT_UPDATE=N`` puts a NaN into one element of the accumulated gradient before optimizer
update N (counted from 1 over the run, as ``actor/lr``'s warm-up counts): the update must be skipped on every rank
(``actor/grad_norm`` NaN at that step, the weights unchanged) and training go on. The variable reaches Ray workers
that a local Ray instance starts from the driver's environment. Nothing happens when it is unset.
"""

from __future__ import annotations

import os

import torch

from repro.train.base import TrainerError

NAN_GRADIENT_ENV = "REPRO_FAULT_NAN_GRADIENT_AT_UPDATE"


def nan_gradient_update() -> int | None:
    """The update the environment asks to poison, or None."""
    raw = os.environ.get(NAN_GRADIENT_ENV)
    if not raw:
        return None
    try:
        update = int(raw)
    except ValueError:
        raise TrainerError(f"{NAN_GRADIENT_ENV}={raw!r}: an update number (1, 2, ...)") from None
    if update < 1:
        raise TrainerError(f"{NAN_GRADIENT_ENV}={raw!r}: updates count from 1")
    return update


def poison_gradient(model: torch.nn.Module) -> str | None:
    """NaN into element 0 of the first parameter's accumulated gradient (megatron DDP's ``main_grad`` buffer where
    the parameter has one, else ``.grad``); returns that parameter's name (None: this rank holds no gradient)."""
    for name, param in model.named_parameters():
        grad = getattr(param, "main_grad", None)
        grad = param.grad if grad is None else grad
        if grad is not None and grad.numel():
            with torch.no_grad():
                grad.view(-1)[0] = float("nan")
            return name
    return None
