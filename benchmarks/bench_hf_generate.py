"""Generation speed of the tiny DeepSeek-V4 with transformers' ``generate`` (sampling, T=0.8, KV cache).

Measures tokens/s at batch 256 on tiny-math prompts (BOS + "37+05=", 7 tokens) for 12 new tokens per row
(the longest response, EOS ignored so every row does the same work), plus the natural run that stops at EOS.
Uses the shipped warm checkpoint if present, else a random init. Prints the load average: the machine is shared.

    python benchmarks/bench_hf_generate.py [--batch 256] [--threads 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from repro.data.tinymath import TINY_PROMPT_TEMPLATE, train_problems
from repro.model.assets import tiny_checkpoint_path
from repro.model.hf_folder import MAX_NEW_TOKENS, load_checkpoint
from repro.model.tiny import build_tiny_model
from repro.model.tokenizer import build_tiny_tokenizer


def load_model():
    folder = tiny_checkpoint_path()
    if (folder / "model.safetensors").is_file():
        return (*load_checkpoint(folder), f"warm checkpoint {folder}")
    return build_tiny_model(0), build_tiny_tokenizer(), "random init (seed 0)"


def timed_generate(model, batch, tokenizer, stop_at_eos: bool) -> tuple[float, int]:
    start = time.perf_counter()
    out = model.generate(
        **batch, do_sample=True, temperature=0.8, top_k=None, top_p=None, max_new_tokens=MAX_NEW_TOKENS,
        min_new_tokens=0 if stop_at_eos else MAX_NEW_TOKENS,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    seconds = time.perf_counter() - start
    new = out[:, batch["input_ids"].shape[1] :]
    # Count real tokens: everything up to and including the first EOS of each row.
    is_eos = new == tokenizer.eos_token_id
    after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
    return seconds, int((~after_eos).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, tokenizer, what = load_model()
    prompts = [TINY_PROMPT_TEMPLATE.format(problem=p.problem) for p in train_problems(seed=9)[: args.batch]]
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    print(f"model: {what}; batch {args.batch}, threads {args.threads}, load average {os.getloadavg()}")
    with torch.no_grad():
        timed_generate(model, batch, tokenizer, stop_at_eos=True)  # warm-up
        for stop_at_eos in (False, True):
            label = "stop at EOS" if stop_at_eos else f"fixed {MAX_NEW_TOKENS} new tokens"
            for _ in range(args.repeats):
                seconds, tokens = timed_generate(model, batch, tokenizer, stop_at_eos)
                print(f"{label:>22}: {tokens:5d} tokens in {seconds:6.2f} s = {tokens / seconds:7.0f} tokens/s")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
