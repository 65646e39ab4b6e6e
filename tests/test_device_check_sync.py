"""benchmarks/device_check.py's streaming-sync step, its CPU side: the trainer process's send on a gloo group
(the GPU check uses NCCL), and the step's skip where no GPU is visible."""

import importlib.util
import threading
from pathlib import Path

import torch

from repro.model.tiny_qwen3_moe import build_tiny_qwen3_moe, checkpoint_tensors
from repro.sync.stream import verified_stream
from repro.sync.group import free_address, receive_all, SyncAddress, SyncGroup

_spec = importlib.util.spec_from_file_location(
    "device_check", Path(__file__).resolve().parents[1] / "benchmarks" / "device_check.py")
device_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(device_check)


def test_trainer_side_streams_each_version_over_gloo(tmp_path):
    model_dir = build_tiny_qwen3_moe(tmp_path / "tiny", seed=0)
    host, port = free_address("127.0.0.1")
    address = dict(host=host, port=port, sender=0, receivers=1, backend="gloo", timeout_s=60)
    sender = threading.Thread(target=device_check.send_checkpoint,
                              args=(address, str(model_dir), [1, 2], [2.0, 1.0], "cpu"))
    sender.start()
    group = SyncGroup(SyncAddress(**address), 1)
    got = {v: {n: t.clone() for _, named in verified_stream(receive_all([group], v), v, 1) for n, t in named}
           for v in (1, 2)}
    sender.join(60)
    original = checkpoint_tensors(model_dir)
    assert sorted(got[1]) == sorted(original) == sorted(got[2])
    head = original["lm_head.weight"]
    assert torch.equal(got[1]["lm_head.weight"], (head.float() * 2.0).to(head.dtype))
    assert all(torch.equal(got[2][n], t) for n, t in original.items())


def test_streaming_sync_step_skips_without_a_gpu(tmp_path):
    if torch.cuda.is_available():
        return  # on a GPU machine the step itself runs in device_check
    assert device_check.step_streaming_sync(tmp_path) == ("SKIP", "no CUDA/ROCm device visible to torch")
