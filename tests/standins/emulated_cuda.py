"""STAND-IN for a CUDA device on a CPU-only torch, as strict about placement as CUDA and ProcessGroupNCCL.

The bugs this catches are placement bugs: a host tensor handed to a GPU model ("Expected all tensors to be on the
same device"), a host tensor handed to an NCCL collective ("Tensors must be CUDA and dense"), a GPU trainer's
weights copied to the host on their way to the sync. On a CPU-only torch every tensor is a host tensor, so plain
tests cannot see them. Here "device" tensors are real CPU data inside a wrapper that reports another device, and a
dispatch mode checks every operation the way CUDA and NCCL would:

* an op mixing device tensors and host tensors raises CUDA's error (a 0-dim host tensor is allowed, as CUDA
  kernels take CPU scalars); copies between host and device (``.to``, ``copy_``) are how data moves, as on a GPU;
* a collective (``c10d::*``) given a host tensor raises ProcessGroupNCCL's error; given device tensors it runs
  on the real gloo group underneath, on their data;
* factories and copies asked for ``device="cuda"`` (or the current device) make device tensors.

The device is reported as ``meta``: PyTorch's C++ device guards refuse a "cuda" device on a build without CUDA,
and ``meta`` has a guard and no data (nothing runs on it: every kernel runs on the CPU data inside the wrapper).
The process looks like a GPU process to the code under test through these, and only these, patches:
``torch.cuda.current_device()`` returns the emulated device (so ``device=torch.cuda.current_device()``, as
megatron-core and ``repro.devices`` allocate, lands on it), ``torch.distributed.get_backend()`` says "nccl" (the
world runs gloo underneath; c10d's error logger then asks ``torch.cuda.nccl.version()``, answered 0.0.0),
``repro.sync.group.PROCESS_GROUPS["nccl"]`` builds ``NCCLGroupStandIn`` (a CPU torch has no ProcessGroupNCCL), and
the Python entry points that the C++ layer would refuse before any dispatch on a CPU build (``Tensor.to``,
``Tensor.cuda``, ``torch.tensor``, ``torch.as_tensor`` towards the device, ``Tensor.tolist`` of a device tensor,
CUDA's lazy init) are routed through the dispatcher. ``torch.cuda.is_available()`` stays False:
code that picks a GPU-only library on it (megatron's optimizer, NCCL init) keeps its CPU choice.

Not covered: NCCL/RCCL themselves, streams and their ordering, device memory, kernels' numerics (the CPU computes
every value, so results equal a CPU run's bit for bit), and ops whose C++ entry checks the device before dispatch
other than those routed above.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import torch
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils._python_dispatch import TorchDispatchMode

DEVICE = torch.device("meta")  # what the emulated GPU is reported as (see the module docstring)
_TO_COPY = torch.ops.aten._to_copy.default
_COPY = torch.ops.aten.copy_.default


class DeviceTensor(torch.Tensor):
    """A tensor on the emulated GPU: CPU data in ``inner``, ``device`` reported as ``DEVICE``."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls, inner.size(), strides=inner.stride(), storage_offset=inner.storage_offset(), dtype=inner.dtype,
            device=DEVICE, requires_grad=inner.requires_grad, layout=inner.layout)
        wrapper.inner = inner
        return wrapper

    def __repr__(self):
        return f"DeviceTensor({self.inner!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"{func}: an emulated GPU tensor used outside emulated_cuda()")


def on_device(device) -> bool:
    """Whether ``device`` names the emulated GPU ("cuda", an index, or the reported device)."""
    if device is None:
        return False
    if isinstance(device, int):
        return True
    return torch.device(device).type in ("cuda", DEVICE.type)


def _wrap(value):
    return tree_map(lambda t: DeviceTensor(t) if isinstance(t, torch.Tensor) and not isinstance(t, DeviceTensor)
                    else t, value)


def _unwrap(value):
    return tree_map(lambda t: t.inner if isinstance(t, DeviceTensor) else t, value)


class DeviceMode(TorchDispatchMode):
    """The checks and the routing of every op (thread-local: each thread that computes enters its own)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        device_in = any(isinstance(t, DeviceTensor) for t in tensors)
        host = [t for t in tensors if not isinstance(t, DeviceTensor) and not (t.dim() == 0 and t.device.type == "cpu")]
        name = func.name()
        if name.startswith("c10d::"):
            if host:
                raise RuntimeError(f"{name}: Tensors must be CUDA and dense (emulated ProcessGroupNCCL: a host "
                                   f"tensor of shape {list(host[0].shape)} was given)")
        elif device_in and host and func not in (_TO_COPY, _COPY):
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"cuda:0 and cpu! (emulated; {name})")
        to_device = on_device(kwargs.get("device"))
        plain_args, plain_kwargs = _unwrap(args), _unwrap(kwargs)
        if to_device:
            plain_kwargs["device"] = torch.device("cpu")
        out = func(*plain_args, **plain_kwargs)
        if func is _COPY:
            return args[0]
        if name.startswith("c10d::"):
            return out  # the collective wrote into the inner tensors
        if func is _TO_COPY:
            stays = device_in and kwargs.get("device") is None
            return _wrap(out) if to_device or stays else out
        return _wrap(out) if device_in or to_device else out


def _to(original):
    def to(self, *args, **kwargs):
        device, dtype = kwargs.get("device"), kwargs.get("dtype")
        for arg in args:
            if isinstance(arg, (str, torch.device, int)) and not isinstance(arg, bool):
                device = arg
            elif isinstance(arg, torch.dtype):
                dtype = arg
        if not (on_device(device) or isinstance(self, DeviceTensor)):
            return original(self, *args, **kwargs)
        target = DEVICE if on_device(device) else (torch.device(device) if device is not None else self.device)
        if target == self.device and (dtype is None or dtype == self.dtype) and not kwargs.get("copy"):
            return self
        return _TO_COPY(self, dtype=dtype or self.dtype, device=target)
    return to


def _factory(original):
    def make(data, *args, device=None, **kwargs):
        if on_device(device):
            return _TO_COPY(original(data, *args, **kwargs), device=DEVICE)
        return original(data, *args, device=device, **kwargs)
    return make


def _tolist(original):
    return lambda self, *a, **k: original(self.inner if isinstance(self, DeviceTensor) else self, *a, **k)


class NCCLGroupStandIn:
    """A weight-sync group (``repro.sync.group.SyncGroup.pg``) as ProcessGroupNCCL behaves: a host tensor is refused
    with its error; device tensors are broadcast by a gloo group on their CPU data. (A sync group is a bare backend
    object whose calls bypass the dispatcher, so ``DeviceMode`` does not see them: this checks them instead.)"""

    def __init__(self, store, rank: int, world: int, timeout):
        import torch.distributed as dist

        self.gloo = dist.ProcessGroupGloo(store, rank, world, timeout)

    def broadcast(self, tensors: list[torch.Tensor], options):
        host = [t for t in tensors if not isinstance(t, DeviceTensor)]
        if host:
            raise RuntimeError(f"Tensors must be CUDA and dense (emulated ProcessGroupNCCL::broadcast: a host tensor "
                               f"of shape {list(host[0].shape)} was given)")
        return self.gloo.broadcast([t.inner for t in tensors], options)


def _gloo_as_nccl():
    from repro.sync import group

    return mock.patch.dict(group.PROCESS_GROUPS, {"nccl": group.Transport(NCCLGroupStandIn, "nccl")})


@contextlib.contextmanager
def emulated_cuda():
    """This process as a GPU process (module docstring); the calling thread computes under ``DeviceMode``. Other
    threads that compute enter ``DeviceMode()`` themselves while this is active."""
    import torch.distributed as dist

    with mock.patch.object(torch.Tensor, "to", _to(torch.Tensor.to)), \
            mock.patch.object(torch.Tensor, "cuda", lambda self, *a, **k: _TO_COPY(self, device=DEVICE)), \
            mock.patch.object(torch.Tensor, "tolist", _tolist(torch.Tensor.tolist)), \
            mock.patch.object(torch, "tensor", _factory(torch.tensor)), \
            mock.patch.object(torch, "as_tensor", _factory(torch.as_tensor)), \
            mock.patch.object(torch.cuda, "_initialized", True), \
            mock.patch.object(torch.cuda, "current_device", lambda: DEVICE.type), \
            mock.patch.object(dist, "get_backend", lambda group=None: "nccl"), \
            mock.patch.object(torch.cuda.nccl, "version", lambda: (0, 0, 0)), \
            _gloo_as_nccl(), DeviceMode():
        yield


def is_on_device(tensor: torch.Tensor) -> bool:
    return isinstance(tensor, DeviceTensor)
