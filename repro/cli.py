"""`repro` command line. Each sub-command lives in its own module, imported only when it is called.

A command module exposes ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# name -> (module, one-line help). Modules are imported lazily so `repro --help` stays fast.
COMMANDS: dict[str, tuple[str, str]] = {
    "notebooks": ("repro.commands.notebooks",
                  "the main job (make repro): notebooks 00 -> 20 with papermill: run, figures, comparison"),
    "recipe": ("repro.commands.recipe", "validate a recipe and print it resolved"),
    "data": ("repro.commands.data", "write the tiny-math train/held-out sets in the DAPO parquet layout"),
    "build-tiny": ("repro.commands.build_tiny",
                   "build the tiny DeepSeek-V4 checkpoint + tokenizer (random init, seeded)"),
    "warmstart": ("repro.commands.warmstart", "SFT warm start of the tiny DeepSeek-V4 on tiny-math"),
    "convert": ("repro.commands.convert", "convert a BF16 HF checkpoint to block-wise FP8 (e4m3fn / e4m3fnuz)"),
    "export": ("repro.commands.export", "a run's checkpoint as a release-layout (or --layout hf) safetensors folder "
                                        "with config, tokenizer and model card"),
    "run": ("repro.commands.run", "the RL run of a recipe on Ray (--resume continues from the newest checkpoint)"),
    "check": ("repro.commands.check", "is this machine / Ray cluster ready for a recipe (PASS/WARN/FAIL/SKIP, --json)"),
    "launch": ("repro.commands.launch",
               "place the recipe's groups on Ray and start the run (--dry-run: placement and worker arguments)"),
    "compare": ("repro.commands.compare", "runs (repro run dir, W&B CSV, LumenRL log, verl JSONL) beside AMD's "
                                          "published numbers, as a Markdown report"),
    "report": ("repro.commands.report", "one HTML page for a run (or several sources): comparison with AMD, figures, "
                                        "caveats, notebooks, raw records"),
    "rollouts": ("repro.commands.rollouts", "a step's trajectories from a run's rollouts/ (--worst-kl K: the K with "
                                            "the largest rollout/trainer KL)"),
    "figures": ("repro.commands.figures", "AMD's four charts from one or more runs' logs, overlaid (PNG + SVG)"),
    "smoke": ("repro.commands.smoke", "3 optimizer steps of a recipe: the setup check before a long run"),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="repro", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        _parser().parse_args(argv or ["--help"])
        return 2
    name, rest = argv[0], argv[1:]
    module = importlib.import_module(COMMANDS[name][0])
    parser = argparse.ArgumentParser(prog=f"repro {name}", description=COMMANDS[name][1])
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    try:
        return int(module.run(args) or 0)
    except ReproError as err:
        print(f"repro {name}: error: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # the reader went away (`repro recipe tiny-cpu | head`): stop quietly, as cat does; point stdout at
        # devnull so the interpreter's final flush does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


from repro.errors import ReproError  # noqa: E402  (kept below main to show the dispatch first)
