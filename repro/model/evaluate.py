"""Sampling accuracy of the tiny model on tiny-math: avg@k at the rollout temperature, with HF ``generate``.

Each problem is prompted as BOS + ``"37+05="``, sampled ``samples`` times at ``temperature`` (0.8, the rollout
temperature of the recipe), and each response -- the text before the first EOS -- is scored with the DAPO
reward (``repro.reward.score_response``), the same rule RL trains on. avg@k is the mean correctness over all
``problems x samples`` responses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from repro.data.tinymath import TINY_PROMPT_TEMPLATE, Arithmetic
from repro.model.hf_folder import MAX_NEW_TOKENS
from repro.reward import score_response

ROLLOUT_TEMPERATURE = 0.8
SAMPLES_PER_PROBLEM = 8


@dataclass(frozen=True)
class SampledAccuracy:
    accuracy: float  # avg@k: mean over problems x samples
    n_problems: int
    samples: int
    temperature: float
    ended_with_eos: float  # share of responses that stopped with EOS within MAX_NEW_TOKENS


def prompt_texts(problems: list[Arithmetic]) -> list[str]:
    return [TINY_PROMPT_TEMPLATE.format(problem=p.problem) for p in problems]


@torch.no_grad()
def sample_responses(
    model, tokenizer, prompts: list[str], samples: int, temperature: float, seed: int, batch_size: int = 256,
    max_new_tokens: int = MAX_NEW_TOKENS,
) -> tuple[list[str], list[bool]]:
    """``samples`` responses per prompt (prompt-major order) and whether each ended with EOS.

    Runs under a forked RNG seeded with ``seed`` so evaluating never moves the caller's random stream.
    """
    rows = [p for p in prompts for _ in range(samples)]
    texts, ended = [], []
    was_training = model.training
    model.eval()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, len(rows), batch_size):
            batch = tokenizer(rows[start : start + batch_size], return_tensors="pt", padding=True)
            out = model.generate(
                **batch,
                do_sample=True,
                temperature=temperature,
                top_k=None,
                top_p=None,
                max_new_tokens=max_new_tokens,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
            for row in out[:, batch.input_ids.shape[1] :].tolist():
                stop = row.index(tokenizer.eos_token_id) if tokenizer.eos_token_id in row else len(row)
                texts.append(tokenizer.decode(row[:stop], skip_special_tokens=True))
                ended.append(stop < len(row))
    model.train(was_training)
    return texts, ended


def sampled_accuracy(
    model,
    tokenizer,
    problems: list[Arithmetic],
    samples: int = SAMPLES_PER_PROBLEM,
    temperature: float = ROLLOUT_TEMPERATURE,
    seed: int = 0,
    batch_size: int = 256,
    max_new_tokens: int = MAX_NEW_TOKENS,
) -> SampledAccuracy:
    """avg@``samples`` of ``model`` on ``problems`` at ``temperature``, scored by the DAPO reward."""
    texts, ended = sample_responses(model, tokenizer, prompt_texts(problems), samples, temperature, seed, batch_size,
                                    max_new_tokens)
    answers = [p.answer for p in problems for _ in range(samples)]
    correct = sum(score_response(text, answer).acc for text, answer in zip(texts, answers))
    return SampledAccuracy(
        accuracy=correct / len(texts),
        n_problems=len(problems),
        samples=samples,
        temperature=temperature,
        ended_with_eos=sum(ended) / len(ended),
    )
