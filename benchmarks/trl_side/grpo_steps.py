"""TRL's side of benchmarks/bench_step_vs_trl.py: TRL's GRPOTrainer on the shipped tiny DeepSeek-V4, run in its own
venv (benchmarks/.venv-trl; TRL 1.16 with the lock's transformers). Prints one JSON line per optimizer step:
{"step": n, "seconds": wall time of the step}. Only the tiny-math prompts and the DAPO reward rule are taken from
repro (plain-Python modules, on PYTHONPATH); the trainer, sampler and loss are TRL's own.

    PYTHONPATH=. benchmarks/.venv-trl/bin/python benchmarks/trl_side/grpo_steps.py --model DIR --steps 12
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from repro.data.tinymath import TINY_PROMPT_TEMPLATE, train_problems
from repro.reward import score_response


class StepTimes(TrainerCallback):
    def __init__(self):
        self.last = None

    def on_step_begin(self, args, state, control, **kwargs):
        if self.last is None:
            self.last = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        print(json.dumps({"step": state.global_step, "seconds": now - self.last}), flush=True)
        self.last = now


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=10086)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    problems = train_problems(digits=2, seed=args.seed)
    answers = {TINY_PROMPT_TEMPLATE.format(problem=p.problem): p.answer for p in problems}
    dataset = Dataset.from_list([{"prompt": prompt} for prompt in answers])

    def dapo_reward(prompts, completions, **kwargs):
        return [score_response(c, answers[p]).score for p, c in zip(prompts, completions)]

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, max_steps=args.steps, learning_rate=args.lr, lr_scheduler_type="constant",
            weight_decay=0.0, adam_beta2=0.98, max_grad_norm=1.0, warmup_steps=0,
            per_device_train_batch_size=args.prompts * args.samples, gradient_accumulation_steps=1,
            num_generations=args.samples, max_completion_length=args.max_new, temperature=args.temperature,
            top_p=1.0, top_k=0, beta=0.0, num_iterations=1, epsilon=0.2, epsilon_high=0.28, loss_type="dapo",
            gradient_checkpointing=args.gradient_checkpointing, router_aux_loss_coef=0.0,
            use_cpu=True, bf16=False, report_to=[], logging_steps=1, save_strategy="no", seed=args.seed,
            dataloader_num_workers=0, disable_tqdm=True,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=dapo_reward, args=config, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[StepTimes()])
        trainer.train()


if __name__ == "__main__":
    main()
