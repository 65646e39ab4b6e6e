"""Device check for whoever has a CUDA or ROCm GPU: what the CPU-only test machine cannot show.

    python benchmarks/device_check.py [--out DIR]      (about 3-8 minutes on one GPU)

Not part of `make test` (pytest collects only tests/; tests/test_device_check.py runs it on the CPU, where every
check that needs a GPU says SKIP). Each check is a ``(name, function)`` in ``CHECKS``; the function returns
``(status, detail)``, status PASS, FAIL or SKIP. ``benchmarks/device_check_megatron.py``, where present, adds its
own ``CHECKS`` in the same form. Every check runs, each under its own try/except (an exception is its FAIL, with
the error); a table is printed and ``device_check.json`` written to $OUT if set, else to --out (default
runs/device_check); the exit code is 1 if any check FAILed.

1. `repro check` for the AMD recipe on this host (informational: one GPU is not the 24-GPU cluster, so its
   GPU-count FAIL is expected; the accelerator, architecture, FP8 format and versions rows are what to read).
2. The tiny DeepSeek-V4 forward on the GPU against the CPU (fp32 logits agree to 1e-3) and block-FP8
   quantisation on the GPU bit-identical to the CPU's, for the format this GPU computes in.
3. repro's own streaming weight sync (``repro.sync``/``repro.sync.group``) over NCCL from a trainer process into a
   vLLM worker on the GPU (tiny Qwen3-MoE, twice: a changed policy, then the original back, whose samples must
   equal the first ones), timed, with block-FP8 quantisation's GB/s on the GPU. NCCL refuses two ranks on one
   GPU ("Duplicate GPU"): with one GPU the trainer's NCCL send is tried, that refusal reported, and the same
   stream then crosses on gloo into the GPU worker. Needs vLLM; skipped without it.
4. The same two syncs through vLLM's own weight-transfer engine (``repro.rollout.vllm_transfer``): device
   buffers packed by the trainer, vLLM's packed consumer, start/update/finish, lm_head read back bit-exact. With
   two GPUs over vLLM's NCCL group (trainer on the second); with one, NCCL cannot pair two ranks on it, so the
   group is the gloo stand-in of tests/standins/vllm_gloo_transfer.py (with CUDA tensors and real streams) and
   the check says so. Needs vLLM with ``vllm.distributed.weight_transfer``; skipped without it.
5. (run last, in the time left) The engine and trainer contract tests, tests/test_rollout_engine.py and
   tests/test_trainer_contract.py. The embedded engine and trainer take no device argument (they build their
   tensors on the CPU), so these run ON THE CPU of the GPU machine: they prove the contract there, not GPU
   execution. Skipped where no GPU is visible (the CPU lanes run them already).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
STANDINS = REPO / "tests" / "standins"
BUDGET_S = 480  # the ~8 minutes a device slot gives this check
NO_GPU = ("SKIP", "no CUDA/ROCm device visible to torch")
Check = tuple[str, Callable[[], tuple[str, str]]]
CLI = ("import sys; from repro import cli; "
       "cli.COMMANDS.setdefault('check', ('repro.commands.check', 'cluster readiness')); sys.exit(cli.main())")


def step_repro_check(out: Path) -> tuple[str, str]:
    path = out / "repro_check_amd.json"
    done = subprocess.run([sys.executable, "-c", CLI, "check", "--recipe", "amd-dsv4-flash-mi308x", "--json", str(path),
                           "--run-dir", str(out / "run")], capture_output=True, text=True, timeout=120, cwd=REPO)
    print(done.stdout[-6000:], done.stderr[-2000:], sep="\n")
    rows = {r["check"]: r for r in json.loads(path.read_text())} if path.exists() else {}
    seen = {k: rows[k]["status"] for k in ("accelerator", "fp8_format", "torch") if k in rows}
    return ("PASS" if rows else "FAIL"), f"informational, exit {done.returncode}; {seen}"


def step_gpu_numerics() -> tuple[str, str]:
    import torch

    from repro.readiness.checks import fp8_format_for
    from repro.fp8.quant import quantize_block
    from repro.model.tiny import BOS_TOKEN_ID, build_tiny_model

    if not torch.cuda.is_available():
        return NO_GPU
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    hip = getattr(torch.version, "hip", None)
    arch = (getattr(props, "gcnArchName", "") or "").split(":")[0] if hip else f"sm_{props.major}{props.minor}"
    fmt = fp8_format_for("rocm" if hip else "cuda", arch) or "e4m3fn"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = build_tiny_model(seed=0)
    ids = torch.tensor([[BOS_TOKEN_ID, 5, 10, 15, 4, 8, 17, 6, 6, 16]])
    with torch.no_grad():
        cpu = model(ids).logits
        gpu = model.to(dev)(ids.to(dev)).logits.cpu()
    logit_diff = float((cpu - gpu).abs().max())
    w = torch.randn(512, 384, generator=torch.Generator().manual_seed(0)) * 0.02
    q_cpu, s_cpu = quantize_block(w, fmt)
    q_gpu, s_gpu = quantize_block(w.to(dev), fmt)
    fp8_same = torch.equal(q_cpu.view(torch.uint8), q_gpu.cpu().view(torch.uint8)) and torch.equal(s_cpu, s_gpu.cpu())
    ok = logit_diff < 1e-3 and fp8_same
    return ("PASS" if ok else "FAIL",
            f"{props.name} ({arch}, {'ROCm ' + hip if hip else 'CUDA ' + str(torch.version.cuda)}): "
            f"tiny model logits GPU vs CPU max |diff| {logit_diff:.2e}; {fmt} block quantisation "
            f"GPU == CPU bit for bit: {fp8_same}")


def step_contract_tests(out: Path, deadline: float) -> tuple[str, str]:
    import torch

    if not torch.cuda.is_available():
        return "SKIP", "no CUDA/ROCm device visible to torch (the CPU lanes run these tests already)"
    left = int(deadline - time.monotonic())
    if left < 60:
        return "SKIP", f"{max(left, 0)} s left of the {BUDGET_S} s budget"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_rollout_engine.py",
           "tests/test_trainer_contract.py", f"--junitxml={out / 'contract_tests.xml'}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=left, cwd=REPO)
    except subprocess.TimeoutExpired:
        return "FAIL", f"contract tests did not finish in {left} s"
    tail = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-300:]
    print(done.stdout[-4000:])
    return ("PASS" if done.returncode == 0 else "FAIL",
            f"on this machine's CPU (the embedded engine/trainer take no device): {tail}")


def send_checkpoint(address: dict, model_dir: str, versions: list[int], scale: list[float], device: str) -> None:
    """The trainer's side of step 4 (its own process): the tiny checkpoint, lm_head scaled per version, streamed
    on a sync group of its own as rank 0. Also run with gloo on the CPU by tests/test_device_check_sync.py."""
    from repro.model.tiny_qwen3_moe import checkpoint_tensors
    from repro.sync.stream import pack_buckets
    from repro.sync.group import SyncAddress, SyncGroup

    group = SyncGroup(SyncAddress(**address), 0, device)
    for version, factor in zip(versions, scale):
        weights = checkpoint_tensors(model_dir)
        weights["lm_head.weight"] = (weights["lm_head.weight"].float() * factor).to(weights["lm_head.weight"].dtype)
        group.send(pack_buckets(weights.items(), 64 * 1024, version))


def step_streaming_sync(out: Path) -> tuple[str, str]:
    import multiprocessing as mp

    import torch

    if not torch.cuda.is_available():
        return NO_GPU
    if importlib.util.find_spec("vllm") is None:
        return "SKIP", "vLLM is not installed in this environment"
    from repro.fp8.quant import quantize_block
    from repro.model.tiny_qwen3_moe import BOS_ID, EOS_ID, build_tiny_qwen3_moe
    from repro.rollout.types import SamplingParams
    from repro.rollout.vllm_args import WORKER_EXTENSION
    from repro.rollout.vllm_engine import VLLMEngine
    from repro.sync.group import free_address

    w = torch.randn(8192, 8192, device="cuda").bfloat16()
    quantize_block(w, "e4m3fn")
    torch.cuda.synchronize()
    start = time.perf_counter()
    quantize_block(w, "e4m3fn")
    torch.cuda.synchronize()
    fp8_gbps = w.numel() * 2 / (time.perf_counter() - start) / 1e9
    del w
    model_dir = build_tiny_qwen3_moe(out / "tiny-qwen3-moe", seed=0)
    args = dict(model=str(model_dir), tokenizer=str(model_dir), dtype="bfloat16", seed=0, max_model_len=64,
                enforce_eager=True, logprobs_mode="processed_logprobs", max_logprobs=0, tensor_parallel_size=1,
                worker_extension_cls=WORKER_EXTENSION, gpu_memory_utilization=0.25)
    engine = VLLMEngine(model_dir, args, eos_id=EOS_ID, max_context=64, record_routing=False)
    params = SamplingParams(n=4, max_new_tokens=8, seed=3)
    notes = []
    try:
        before = engine.generate([[BOS_ID, 3, 4]], params)
        for backend in ("nccl", "gloo"):
            address = dict(zip(("host", "port"), free_address("127.0.0.1")), sender=0, receivers=1,
                           backend=backend, timeout_s=90)
            device = "cuda:1" if torch.cuda.device_count() > 1 else "cuda:0"
            sender = mp.get_context("spawn").Process(target=send_checkpoint, args=(
                address, str(model_dir), [1, 2], [2.0, 1.0], device if backend == "nccl" else "cpu"))
            sender.start()
            try:
                from repro.sync.group import SyncAddress

                started = time.perf_counter()
                changed = engine.receive_from_groups([SyncAddress(**address)], version=1)
                moved = engine.generate([[BOS_ID, 3, 4]], params)
                back = engine.receive_from_groups([SyncAddress(**address)], version=2)
                seconds = time.perf_counter() - started
            except Exception as err:
                sender.kill()
                notes.append(f"{backend}: {type(err).__name__}: {str(err)[:300]}")
                continue
            finally:
                sender.join(60)
            after = engine.generate([[BOS_ID, 3, 4]], params)
            same = [t.response_ids for t in after.trajectories] == [t.response_ids for t in before.trajectories]
            differs = [t.response_ids for t in moved.trajectories] != [t.response_ids for t in before.trajectories]
            detail = (f"{backend}: 2 syncs of {changed.nbytes / 1e6:.1f} MB ({changed.buckets} buckets) in "
                      f"{seconds:.1f} s; changed policy changed samples: {differs}; original back reproduces "
                      f"the first samples: {same}; block-FP8 quantisation on the GPU {fp8_gbps:.1f} GB/s")
            return "PASS" if same and differs and back.version == 2 else "FAIL", "; ".join(notes + [detail])
        return "FAIL", "; ".join(notes)
    finally:
        engine.close()


def _load(name: str):
    """A module of benchmarks/ by file (benchmarks/ is no package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def checks(out: Path, deadline: float) -> list[Check]:
    """This file's checks, then device_check_megatron.py's (where present), then the contract tests."""
    step_vllm_engine_sync = _load("device_check_vllm").step_vllm_engine_sync
    own: list[Check] = [("repro_check", lambda: step_repro_check(out)), ("gpu_numerics", step_gpu_numerics),
                        ("repro_stream_sync", lambda: step_streaming_sync(out)),
                        ("vllm_engine_sync", lambda: step_vllm_engine_sync(out))]
    if (REPO / "benchmarks" / "device_check_megatron.py").exists():
        own += list(_load("device_check_megatron").CHECKS)
    return own + [("contract_tests", lambda: step_contract_tests(out, deadline))]


def run_checks(named: list[Check]) -> dict[str, dict]:
    report = {}
    for name, check in named:
        started = time.monotonic()
        try:
            status, detail = check()
            if status not in ("PASS", "FAIL", "SKIP"):
                status, detail = "FAIL", f"the check answered {status!r}, not PASS/FAIL/SKIP: {detail}"
        except Exception as err:  # one broken check must not hide the others
            status, detail = "FAIL", f"{type(err).__name__}: {err}"
        report[name] = {"status": status, "detail": detail, "seconds": round(time.monotonic() - started, 1)}
        print(f"== {name}: {status} ({report[name]['seconds']} s) {detail}", flush=True)
    return report


def print_table(report: dict[str, dict]) -> None:
    width = max(len(n) for n in report)
    print(f"\n{'check':<{width}}  status  seconds  detail")
    for name, r in report.items():
        print(f"{name:<{width}}  {r['status']:<6}  {r['seconds']:7.1f}  {r['detail'][:160]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "runs" / "device_check"),
                        help="where device_check.json goes ($OUT if set)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    deadline = time.monotonic() + BUDGET_S
    report = run_checks(checks(out, deadline))
    print_table(report)
    path = out / "device_check.json"
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(report, indent=2) + "\n")
    partial.replace(path)
    return 1 if any(r["status"] == "FAIL" for r in report.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
