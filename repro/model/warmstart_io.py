"""Run the warm start, measure it, and write the checkpoint with its provenance (``warmstart.json``) and hashes."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import torch
import transformers

from repro.data.tinymath import held_out_problems, train_problems
from repro.data.tinymath_long import long_held_out_problems
from repro.model.assets import REGENERATE_COMMAND, record_hashes, tiny_checkpoint_path
from repro.model.hf_folder import save_checkpoint
from repro.model.evaluate import ROLLOUT_TEMPERATURE, SAMPLES_PER_PROBLEM, sampled_accuracy
from repro.model.tiny import parameter_count
from repro.model.warmstart import WarmStartConfig, config_dict, task_train_problems, warm_start

FINAL_TRAIN_PROBLEMS = 256  # the final report's training-distribution sample (eval slice uses another order)
FINAL_EVAL_SEED = 12345


def final_accuracies(model, tokenizer, config: WarmStartConfig) -> dict:
    """avg@8 at T=0.8 on 256 training problems (a fresh order) and on the task's 30 held-out problems."""
    train = task_train_problems(config, config.seed + 2)[:FINAL_TRAIN_PROBLEMS]
    held = held_out_problems() if config.terms == 0 else long_held_out_problems(config.terms)
    result = {}
    for name, problems in (("train", train), ("held_out", held)):
        acc = sampled_accuracy(model, tokenizer, problems, seed=FINAL_EVAL_SEED, max_new_tokens=config.max_new_tokens)
        result[name] = {"avg@8": acc.accuracy, "problems": acc.n_problems, "ended_with_eos": acc.ended_with_eos}
    return result


def run_and_save(config: WarmStartConfig, out: str | Path, command: str, log=print, record: bool = True) -> dict:
    """Warm start with ``config``, then write ``out`` (checkpoint + warmstart.json) and ``<out>.sha256``."""
    result = warm_start(config, log=log)
    accuracies = final_accuracies(result.model, result.tokenizer, config)
    log(
        f"done in {result.wall_s:.0f} s after {result.steps} steps: avg@8 train {accuracies['train']['avg@8']:.3f}, "
        f"held-out {accuracies['held_out']['avg@8']:.3f}"
    )
    provenance = {
        "command": command,
        "config": config_dict(config),
        "parameters": parameter_count(result.model),
        "steps": result.steps,
        "reached_target": result.reached_target,
        "train_wall_s": round(result.wall_s, 1),
        "load_average_at_end": list(os.getloadavg()),
        "accuracy_T0.8": {"temperature": ROLLOUT_TEMPERATURE, "samples": SAMPLES_PER_PROBLEM, **accuracies},
        "history": result.history,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
    }
    folder = save_checkpoint(
        result.model, result.tokenizer, out, extra_files={"warmstart.json": json.dumps(provenance, indent=1) + "\n"},
        max_new_tokens=config.max_new_tokens,
    )
    if record:
        log(f"hashes recorded in {record_hashes(folder)}")
    return provenance


def ensure_warm_checkpoint(log=print) -> Path:
    """The shipped warm checkpoint folder, regenerating it (default seed, ~2-5 min on 2 cores) if missing."""
    folder = tiny_checkpoint_path()
    if (folder / "model.safetensors").is_file() and (folder / "config.json").is_file():
        return folder
    log(f"{folder} is missing: regenerating it ({REGENERATE_COMMAND})")
    run_and_save(WarmStartConfig(), folder, command=REGENERATE_COMMAND, log=log)
    return folder
