"""How far an FP8-weight rollout copy is from the fp32 trainer on one GRPO batch: rollout_corr/kl, k3_kl, ESS.

    python benchmarks/fp8_mismatch.py [--model-dir DIR] [--sft-steps 150] [--prompts 32] [--n 8]

The rollout copy gets the trainer's ``named_weights()`` through ``repro.fp8.quantize_tensors`` (block FP8,
e4m3fn, 128x128) and dequantised back, i.e. the weight rounding the FP8 rollout serves (activations stay fp32
here, so this is a lower bound on the real kernel mismatch). The copy samples tiny-math responses at T=0.8
and rescores them with its routing recorded; the trainer then recomputes log π_old with that routing replayed
(R3) and, for comparison, with its own routing. A random-init model is near-uniform, so without a ``--model-dir``
the model first gets ``--sft-steps`` steps of the warm-start SFT to make its distribution peaked.
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch

from repro.algos import logprobs_from_logits, rollout_corr_metrics
from repro.data.tinymath import TINY_PROMPT_TEMPLATE, train_problems
from repro.fp8.quant import dequantize_block
from repro.fp8.stream import quantize_tensors
from repro.model.routing import RoutingRecorder
from repro.model.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID, build_tiny_model
from repro.model.tokenizer import build_tiny_tokenizer, encode_strict
from repro.rollout.types import FinishReason, Trajectory
from repro.train.batch import build_batch
from repro.train.embedded import EmbeddedTrainer

TEMPERATURE = 0.8
SCALE_SUFFIX = "_scale_inv"


def fp8_rollout_copy(trainer: EmbeddedTrainer, fmt: str = "e4m3fn") -> torch.nn.Module:
    """A copy of the trainer's model whose quantised weights are FP8-rounded (dequantised to fp32)."""
    state, scales = {}, {}
    for name, tensor in quantize_tensors(trainer.named_weights(), fmt):
        (scales if name.endswith(SCALE_SUFFIX) else state)[name] = tensor
    for name, scale in scales.items():
        weight = name[: -len(SCALE_SUFFIX)]
        state[weight] = dequantize_block(state[weight], scale)
    model = copy.deepcopy(trainer.model).float()
    model.load_state_dict(state, strict=True)
    return model, len(scales)


def sample_batch(model, prompts: list[list[int]], n: int, max_new_tokens: int, seed: int):
    """Sample n responses per prompt from ``model``, then rescore them with a full forward recording routing."""
    torch.manual_seed(seed)
    input_ids = torch.tensor(prompts).repeat_interleave(n, dim=0)
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, do_sample=True, temperature=TEMPERATURE, top_p=1.0, top_k=0,
                             max_new_tokens=max_new_tokens, eos_token_id=EOS_TOKEN_ID, pad_token_id=PAD_TOKEN_ID)
    trajectories = []
    for row, ids in enumerate(out[:, input_ids.shape[1]:].tolist()):
        finished = EOS_TOKEN_ID in ids
        response = ids[: ids.index(EOS_TOKEN_ID) + 1] if finished else ids
        reason = FinishReason.EOS if finished else FinishReason.LENGTH
        trajectories.append(Trajectory(row // n, row % n, prompts[row // n], response,
                                       torch.zeros(len(response)), reason, weight_version=0))
    batch = build_batch(trajectories, torch.zeros(len(trajectories)), PAD_TOKEN_ID, with_routing=False)
    with torch.no_grad(), RoutingRecorder(model) as recorder:
        logits = model(input_ids=batch.input_ids, use_cache=False).logits
    batch.routing = recorder.indices()
    own = logprobs_from_logits(logits, batch.targets, TEMPERATURE)
    batch.rollout_logprobs = torch.where(batch.response_mask, own, 0.0)
    return batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default=None)
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    tokenizer = build_tiny_tokenizer()
    if args.model_dir:
        model = args.model_dir
    else:
        from repro.model.warmstart import WarmStartConfig, train_steps

        model = build_tiny_model(args.seed)
        losses = train_steps(model, tokenizer, WarmStartConfig(batch_size=64), args.sft_steps)["losses"]
        print(f"SFT {args.sft_steps} steps: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    trainer = EmbeddedTrainer(model, temperature=TEMPERATURE)
    rollout, num_fp8 = fp8_rollout_copy(trainer)
    problems = train_problems(seed=args.seed, n=args.prompts)
    prompts = [encode_strict(tokenizer, TINY_PROMPT_TEMPLATE.format(problem=p.problem)) for p in problems]
    batch = sample_batch(rollout, prompts, args.n, max_new_tokens=16, seed=args.seed)
    report = {"fp8_tensors": num_fp8, "rows": batch.num_rows, "response_tokens": int(batch.response_mask.sum())}
    for label, replay in (("r3", True), ("no_replay", False)):
        old = trainer.logprobs(batch, replay_routing=replay)
        metrics = rollout_corr_metrics(old.logprobs, batch.rollout_logprobs, batch.response_mask, "token", 2.0)
        for key in ("kl", "k3_kl", "rollout_is_eff_sample_size", "rollout_is_ratio_fraction_high", "rollout_is_max"):
            report[f"{label}/rollout_corr/{key}"] = metrics[f"rollout_corr/{key}"]
        if replay:
            report["entropy"] = float(old.entropy[batch.response_mask].mean())
    # How often the fp32 trainer's own router would pick other experts than the FP8 rollout did.
    with torch.no_grad(), RoutingRecorder(trainer.model) as recorder:
        trainer.model(input_ids=batch.input_ids, use_cache=False)
    flips = [(recorder.indices()[k].sort(-1).values != batch.routing[k].sort(-1).values).any(-1)[batch.response_mask]
             for k in batch.routing]
    report["routing_flip_fraction"] = float(torch.cat(flips).float().mean())
    report["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
