"""Embedded rollout engine vs transformers' `generate` on the tiny DeepSeek-V4, same run, same batch.

256 sequences (32 tiny-math prompts x 8 samples), T=0.8, up to 16 new tokens, stop at EOS, one torch thread
(what each Ray worker gets in the tiny recipe; pass --threads to change). The two sides run alternately and each
keeps its best of --repeats, by wall clock and by CPU time (the steadier figure on a shared machine). Also reports
the fraction of the machine's FLOP limit: model FLOPs per token (2 x active matmul parameters) x tokens/s, divided
by the GFLOP/s of a large fp32 matmul measured in the same run.

    .venv/bin/python benchmarks/bench_engine_vs_hf.py [--threads 1] [--repeats 3] [--diverging]
"""

from __future__ import annotations

import argparse
import os
import time

import torch


def matmul_gflops(size: int = 2048, repeats: int = 5) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * size**3 * repeats / (time.perf_counter() - start) / 1e9


def active_matmul_params(model) -> int:
    """Parameters a token multiplies through: all but the embedding table, with routed experts at top_k/E."""
    cfg = model.config
    total, routed = 0, 0
    for name, p in model.named_parameters():
        if "embed_tokens" in name:
            continue
        total += p.numel()
        if ".experts." in name:
            routed += p.numel()
    return int(total - routed * (1 - cfg.num_experts_per_tok / cfg.n_routed_experts))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--diverging", action="store_true",
                        help="a random tiny model, random 7-token prompts, T=1: samples part at the first tokens, "
                             "so the engine's shared rows save little (its floor)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from repro.data.recipe_datasets import prompt_ids
    from repro.data.tinymath import TINY_PROMPT_TEMPLATE, train_problems
    from repro.model.warmstart_io import ensure_warm_checkpoint
    from repro.model.hf_folder import load_checkpoint
    from repro.rollout.embedded import EmbeddedEngine
    from repro.rollout.types import SamplingParams

    if args.diverging:
        from repro.model.tiny import BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID, build_tiny_model

        model, temperature, eos_id, pad_id = build_tiny_model(seed=0), 1.0, EOS_TOKEN_ID, PAD_TOKEN_ID
        draw = torch.Generator().manual_seed(0)
        prompts = [[BOS_TOKEN_ID] + torch.randint(3, model.config.vocab_size, (6,), generator=draw).tolist()
                   for _ in range(32)]
    else:
        model, tok = load_checkpoint(ensure_warm_checkpoint())
        temperature, eos_id, pad_id = 0.8, tok.eos_token_id, tok.pad_token_id
        prompts = [tok(TINY_PROMPT_TEMPLATE.format(problem=p.problem)).input_ids for p in train_problems(n=32, seed=1)]
    engine = EmbeddedEngine(model, eos_id, pad_id, max_context=64)
    params = SamplingParams(n=8, temperature=temperature, max_new_tokens=16, seed=0)
    ids = torch.tensor([p for p in prompts for _ in range(8)])

    def run_engine():
        result = engine.generate(prompts, params)
        return result.generated_tokens

    def run_hf():
        torch.manual_seed(0)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                             temperature=temperature, top_k=None, top_p=None, max_new_tokens=16, eos_token_id=eos_id,
                             pad_token_id=pad_id)
        new = out[:, ids.shape[1]:]
        ended = (new == eos_id).int().cumsum(1)
        return int(((ended == 0) | ((ended == 1) & (new == eos_id))).sum())

    # The two sides alternate, so a change in the machine's load hits both; each keeps its best wall-clock rate
    # and its best CPU-time rate (process_time: one thread, so what the other processes on a shared machine
    # take does not count against it).
    sides = {"embedded engine (routing recorded)": run_engine, "transformers generate": run_hf}
    rates = {name: 0.0 for name in sides}
    cpu_rates = {name: 0.0 for name in sides}
    for fn in sides.values():
        fn()  # warm-up
    for _ in range(args.repeats):
        for name, fn in sides.items():
            start, cpu_start = time.perf_counter(), time.process_time()
            tokens = fn()
            rates[name] = max(rates[name], tokens / (time.perf_counter() - start))
            cpu_rates[name] = max(cpu_rates[name], tokens / (time.process_time() - cpu_start))
    peak = matmul_gflops()
    flops_per_token = 2 * active_matmul_params(model)
    print(f"threads={args.threads} load={os.getloadavg()[0]:.1f} batch=256 max_new=16 repeats={args.repeats} "
          f"(interleaved){' diverging' if args.diverging else ''}")
    for name, rate in rates.items():
        print(f"{name:36s} {rate:9.0f} tok/s   {flops_per_token * rate / 1e9:6.3f} GFLOP/s = "
              f"{100 * flops_per_token * rate / 1e9 / peak:5.2f}% of the {peak:.0f} GFLOP/s fp32 matmul   "
              f"{cpu_rates[name]:9.0f} tok/s of CPU time")
    engine_rate, hf_rate = rates.values()
    engine_cpu, hf_cpu = cpu_rates.values()
    print(f"engine / generate = {engine_rate / hf_rate:.2f}x wall clock, {engine_cpu / hf_cpu:.2f}x CPU time   "
          f"(model: {flops_per_token / 1e6:.2f} MFLOP per token)")


if __name__ == "__main__":
    main()
