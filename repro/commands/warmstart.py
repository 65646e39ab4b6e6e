"""`repro warmstart`: deterministic SFT warm start of the tiny DeepSeek-V4 on tiny-math, stopped on accuracy."""

from __future__ import annotations

import argparse
import shlex
import sys

from repro.model.warmstart import WarmStartConfig
from repro.model.warmstart_io import run_and_save

DEFAULTS = WarmStartConfig()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="checkpoint folder to write; <out>.sha256 is written beside it")
    parser.add_argument("--seed", type=int, default=DEFAULTS.seed)
    parser.add_argument("--target-accuracy", type=float, default=DEFAULTS.target_accuracy,
                        help="stop at the first evaluation whose avg@8 (T=0.8) reaches this")
    parser.add_argument("--max-steps", type=int, default=DEFAULTS.max_steps)
    parser.add_argument("--lr", type=float, default=DEFAULTS.lr)
    parser.add_argument("--batch-size", type=int, default=DEFAULTS.batch_size)
    parser.add_argument("--eval-every", type=int, default=DEFAULTS.eval_every)
    parser.add_argument("--terms", type=int, default=DEFAULTS.terms,
                        help="0: tiny-math; N: tiny-math-long with N worked terms "
                             "(repro/assets/tiny-dsv4-long-warm: 12)")
    parser.add_argument("--first-eval-step", type=int, default=DEFAULTS.first_eval_step,
                        help="no evaluation before this step "
                             "(an evaluation of a model that cannot yet answer costs time)")
    parser.add_argument("--eval-problems", type=int, default=DEFAULTS.eval_problems,
                        help="problems of each evaluation (x 8 samples)")
    parser.add_argument("--threads", type=int, default=DEFAULTS.threads,
                        help="torch threads, pinned for bit-identical results")
    parser.add_argument("--no-hashes", action="store_true", help="do not write <out>.sha256")


def run(args: argparse.Namespace) -> int:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one "Writing model shards" bar per save is noise in a CLI log

    config = WarmStartConfig(
        seed=args.seed, target_accuracy=args.target_accuracy, max_steps=args.max_steps, lr=args.lr,
        batch_size=args.batch_size, eval_every=args.eval_every, threads=args.threads, terms=args.terms,
        first_eval_step=args.first_eval_step, eval_problems=args.eval_problems,
    )
    command = "python -m repro warmstart " + shlex.join(
        sys.argv[2:] if sys.argv[1:2] == ["warmstart"] else sys.argv[1:])
    run_and_save(config, args.out, command=command, record=not args.no_hashes)
    return 0
