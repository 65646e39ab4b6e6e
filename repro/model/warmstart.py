"""Deterministic SFT warm start of the tiny DeepSeek-V4 on tiny-math.

Why stop on an accuracy target: RL needs a start on the steep part of the SFT curve (shared/notes/
tiny-learning.md: avg@8 went 14% -> 21% -> 31% -> 40% over steps 300-375), so a fixed step count easily
overshoots the 25-45% band (measured here: 26% at step 400, 45% at 425). Every ``eval_every`` steps
(``fine_eval_every`` once past half the target) we sample avg@8 at T=0.8 on a fixed slice of the training
distribution and stop at the first evaluation at or above ``target_accuracy``.

Determinism: one seed drives the weight init, hash table, batch order and evaluation sampling; the thread count
is pinned (a different count changes float reduction order) and ``torch.use_deterministic_algorithms`` is on,
so the same seed and thread count give bit-identical weights.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from repro.data.tinymath import TINY_PROMPT_TEMPLATE, Arithmetic, train_problems
from repro.data.tinymath_long import RunningTotal, long_train_problems
from repro.model.evaluate import sampled_accuracy
from repro.model.hf_folder import MAX_NEW_TOKENS
from repro.model.tiny import build_tiny_model
from repro.model.tokenizer import build_tiny_tokenizer, encode_strict

IGNORE = -100


@dataclass(frozen=True)
class WarmStartConfig:
    seed: int = 0
    batch_size: int = 128
    lr: float = 1e-3
    warmup_steps: int = 30
    betas: tuple[float, float] = (0.9, 0.98)
    grad_clip: float = 1.0
    eval_every: int = 25
    fine_eval_every: int = 10  # once avg@8 passes half the target: it climbed 26% -> 45% in 25 steps here
    first_eval_step: int = 250  # avg@8 was 4% at step 200-225 here: skip the cost of evaluating earlier
    target_accuracy: float = 0.30
    max_steps: int = 800
    eval_problems: int = 128  # x 8 samples = 1024 responses: about +-1.5 points of sampling noise
    threads: int = 1  # 2 threads on a shared 2-core machine ran 15x slower (OpenMP spin-waits): 1 is robust
    terms: int = 0  # 0: tiny-math; N > 0: tiny-math-long with N worked terms (repro/data/tinymath_long.py)

    @property
    def max_new_tokens(self) -> int:
        """Room for the longest target response + EOS (+2 spare, as the short task's 12 for its 11)."""
        return max_response_tokens(self.terms)


def max_response_tokens(terms: int) -> int:
    """Generated tokens the task's longest response needs with its EOS, plus two (0: tiny-math's 12)."""
    if terms == 0:
        return MAX_NEW_TOKENS
    return len(RunningTotal(99, 9, terms).response) + 1 + 2  # one token per character


def task_train_problems(config: "WarmStartConfig", seed: int) -> list:
    """The training problems of the configured task in a seeded order."""
    return train_problems(seed=seed) if config.terms == 0 else long_train_problems(config.terms, seed=seed)


@dataclass
class WarmStartResult:
    model: torch.nn.Module
    tokenizer: object
    steps: int
    wall_s: float
    reached_target: bool
    history: list[dict] = field(default_factory=list)  # one entry per evaluation: step, loss, accuracy


def sft_batch(problems: list[Arithmetic] | list[RunningTotal], tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, labels)``, both ``[batch, max_len]``: BOS + prompt + response + EOS, right-padded.

    Labels are IGNORE on the prompt and padding, so the loss covers only the response and its EOS. They are
    *not* shifted: ``labels[:, t]`` is the target for ``logits[:, t - 1]``.
    """
    rows, targets = [], []
    for p in problems:
        prompt = encode_strict(tokenizer, TINY_PROMPT_TEMPLATE.format(problem=p.problem))
        response = encode_strict(tokenizer, p.response)[1:]  # drop BOS
        ids = prompt + response + [tokenizer.eos_token_id]
        rows.append(ids)
        targets.append([IGNORE] * len(prompt) + ids[len(prompt) :])
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for i, (ids, tgt) in enumerate(zip(rows, targets)):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, : len(tgt)] = torch.tensor(tgt)
    return input_ids, labels


def sft_loss(model, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over response + EOS positions. Right padding sits after every target,
    and attention is causal, so no attention mask is needed."""
    logits = model(input_ids=input_ids).logits[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=IGNORE)


def make_optimizer(model, config: WarmStartConfig):
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, betas=config.betas)
    warmup = max(config.warmup_steps, 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    return optimizer, schedule


def deterministic_setup(threads: int) -> None:
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def train_steps(model, tokenizer, config: WarmStartConfig, steps: int, state: dict | None = None) -> dict:
    """Run ``steps`` SFT steps; ``state`` (optimizer, schedule, generator, pool, losses) carries across calls."""
    if state is None:
        optimizer, schedule = make_optimizer(model, config)
        state = {
            "optimizer": optimizer,
            "schedule": schedule,
            "generator": torch.Generator().manual_seed(config.seed),
            "pool": task_train_problems(config, config.seed),
            "losses": [],
            "step": 0,
        }
    model.train()
    pool = state["pool"]
    for _ in range(steps):
        picks = torch.randint(len(pool), (config.batch_size,), generator=state["generator"]).tolist()
        input_ids, labels = sft_batch([pool[i] for i in picks], tokenizer)
        loss = sft_loss(model, input_ids, labels)
        state["optimizer"].zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        state["optimizer"].step()
        state["schedule"].step()
        state["losses"].append(loss.item())
        state["step"] += 1
    model.eval()
    return state


def warm_start(config: WarmStartConfig = WarmStartConfig(), log: Callable[[str], None] = print) -> WarmStartResult:
    """Train from a seeded random init until avg@8 on a fixed training slice reaches ``target_accuracy``."""
    deterministic_setup(config.threads)
    started = time.perf_counter()
    model = build_tiny_model(config.seed)
    tokenizer = build_tiny_tokenizer()
    # another order: not the first batches
    eval_set = task_train_problems(config, config.seed + 1)[: config.eval_problems]
    state, history, reached = None, [], False
    while (state["step"] if state else 0) < config.max_steps:
        done = state["step"] if state else 0
        if done < config.first_eval_step:
            chunk = config.first_eval_step
        elif history and history[-1]["accuracy"] >= config.target_accuracy / 2:
            chunk = config.fine_eval_every
        else:
            chunk = config.eval_every
        state = train_steps(model, tokenizer, config, min(chunk, config.max_steps - done), state)
        # One generate batch for the whole slice: per-step cost is per-layer overhead, nearly flat in batch size.
        acc = sampled_accuracy(model, tokenizer, eval_set, seed=config.seed + state["step"], batch_size=1024,
                               max_new_tokens=config.max_new_tokens).accuracy
        recent = state["losses"][-config.eval_every :]
        history.append({"step": state["step"], "loss": sum(recent) / len(recent), "accuracy": acc,
                        "wall_s": round(time.perf_counter() - started, 1)})
        log(f"step {state['step']:4d}  loss {history[-1]['loss']:.3f}  avg@8 {acc:.3f}  ({history[-1]['wall_s']} s)")
        if acc >= config.target_accuracy:
            reached = True
            break
    return WarmStartResult(model, tokenizer, state["step"], time.perf_counter() - started, reached, history)


def config_dict(config: WarmStartConfig) -> dict:
    return asdict(config)
