"""benchmarks/device_check.py's check of the weight sync through vLLM's own weight-transfer engine, on a GPU.

Two syncs of the tiny Qwen3-MoE from a trainer process into a vLLM worker (lm_head doubled, then as it was), the
trainer packing device buffers with ``repro.rollout.vllm_transfer.TransferSender`` and the worker applying them
in vLLM's start/update/finish lifecycle. PASS: lm_head read back bit-exact after each sync, the doubled head
changes the samples and the original brings the first samples back. With two GPUs the group is vLLM's own NCCL
group (trainer on the second GPU); NCCL will not put two ranks on one GPU, so with one GPU the group is the
gloo stand-in of tests/standins/vllm_gloo_transfer.py, and the detail says so (CUDA buffers and streams, vLLM's
packed producer/consumer and reload still run for real).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STANDINS = REPO / "tests" / "standins"
BUCKET_BYTES = 256 * 1024  # several buffers for the tiny model, so both of vLLM's buffer slots are reused


def send_transfer(address, model_dir: str, nccl: bool, errors) -> None:
    """The trainer's rank 0 (its own process): the checkpoint on its GPU, sent twice through vLLM's engine."""
    sys.path.insert(0, str(STANDINS))
    import torch

    from repro.model.tiny_qwen3_moe import checkpoint_tensors
    from repro.rollout.vllm_transfer import TransferSender

    try:
        device = torch.device("cuda", 1 if nccl else 0)
        torch.cuda.set_device(device)
        if nccl:
            sender = TransferSender(address)  # vLLM's own trainer endpoint on this device
        else:
            from vllm_gloo_transfer import GlooBroadcast

            sender = TransferSender(address, group=GlooBroadcast(address.host, address.port, 0, address.world))
        weights = {n: t.to(device) for n, t in checkpoint_tensors(model_dir).items()}
        head = weights["lm_head.weight"]
        for version, factor in ((1, 2.0), (2, 1.0)):
            weights["lm_head.weight"] = (head.float() * factor).to(head.dtype)
            sender.send(((n, weights[n]) for n in address.names), version, device=device)
        torch.cuda.synchronize()
    except Exception as err:  # the receiver reports it
        errors.put(f"trainer: {type(err).__name__}: {err}")
        raise


def step_vllm_engine_sync(out: Path) -> tuple[str, str]:
    import multiprocessing as mp

    import torch

    if not torch.cuda.is_available():
        return "SKIP", "no CUDA/ROCm device visible to torch"
    if importlib.util.find_spec("vllm") is None:
        return "SKIP", "vLLM is not installed in this environment"
    if importlib.util.find_spec("vllm.distributed.weight_transfer") is None:
        import vllm

        return "SKIP", f"vLLM {vllm.__version__} has no weight-transfer engine (vllm.distributed.weight_transfer)"
    sys.path.insert(0, str(STANDINS))  # the stand-in extension, for vLLM's worker processes too
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(STANDINS), os.environ.get("PYTHONPATH")) if p)
    from safetensors.torch import load
    from vllm_gloo_transfer import BACKEND

    from repro.model.served import served_from_folder
    from repro.model.tiny_qwen3_moe import BOS_ID, EOS_ID, build_tiny_qwen3_moe, checkpoint_tensors
    from repro.rollout.types import SamplingParams
    from repro.rollout.vllm_engine import VLLMEngine
    from repro.rollout.vllm_transfer import packed_buckets, transfer_address
    from repro.sync.group import free_address

    nccl = torch.cuda.device_count() > 1
    model_dir = build_tiny_qwen3_moe(out / "tiny-qwen3-moe-transfer", seed=0)
    args = dict(model=str(model_dir), tokenizer=str(model_dir), dtype="bfloat16", seed=0, max_model_len=64,
                enforce_eager=True, logprobs_mode="processed_logprobs", max_logprobs=0, tensor_parallel_size=1,
                worker_extension_cls="vllm_gloo_transfer.StandinWorkerExtension", gpu_memory_utilization=0.25,
                weight_transfer_config={"backend": "nccl" if nccl else BACKEND})
    engine = VLLMEngine(model_dir, args, eos_id=EOS_ID, max_context=64, record_routing=False)
    ctx = mp.get_context("spawn")
    errors = ctx.Queue()
    try:
        def head() -> torch.Tensor:
            blob = engine.llm.collective_rpc("standin_parameter", args=("lm_head.weight",))[0]
            return load(blob)["lm_head.weight"]

        served = served_from_folder(model_dir)
        address = transfer_address(*free_address("127.0.0.1"), receivers=1, bucket_bytes=BUCKET_BYTES, served=served)
        params = SamplingParams(n=4, max_new_tokens=8, seed=3)
        before = engine.generate([[BOS_ID, 3, 4]], params)
        sender = ctx.Process(target=send_transfer, args=(address, str(model_dir), nccl, errors))
        sender.start()
        started = time.perf_counter()
        try:
            first = engine.receive_transfer(address, version=1)
            doubled, moved = head(), engine.generate([[BOS_ID, 3, 4]], params)
            second = engine.receive_transfer(address, version=2)
        except Exception as err:
            sender.kill()
            trainer = errors.get(timeout=5) if not errors.empty() else "no trainer error"
            return "FAIL", f"{type(err).__name__}: {str(err)[:300]}; {trainer}"
        finally:
            sender.join(60)
        seconds = time.perf_counter() - started
        restored, after = head(), engine.generate([[BOS_ID, 3, 4]], params)
        original = checkpoint_tensors(model_dir)["lm_head.weight"]
        exact = torch.equal(doubled, (original.float() * 2).to(original.dtype)) and torch.equal(restored, original)
        changed = [t.response_ids for t in moved.trajectories] != [t.response_ids for t in before.trajectories]
        same = [t.response_ids for t in after.trajectories] == [t.response_ids for t in before.trajectories]
        group = ("vLLM's NCCL group, trainer on cuda:1" if nccl else
                 "STAND-IN group: gloo with CUDA tensors (one GPU: NCCL will not pair two ranks on it)")
        detail = (f"{group}; 2 syncs of {first.nbytes / 1e6:.1f} MB in {packed_buckets(address)} packed buffers "
                  f"each, {seconds:.1f} s; lm_head bit-exact after both: {exact}; doubled head changed the samples: "
                  f"{changed}; original back reproduces them: {same}")
        ok = exact and changed and same and sender.exitcode == 0 and second.version == 2
        return "PASS" if ok else "FAIL", detail
    finally:
        engine.close()
