"""Starting verl as its own program on the Ray head: ``python -u -m verl.trainer.main_ppo <overrides>``, in a process
group of its own (``repro.process_group``: recorded, stopped with SIGINT, then SIGTERM, then SIGKILL, never matched
by name), with its console output appended to ``logs/verl.log``.

Environment: the driver gets ``verl.env`` and the file-logger path; verl's TaskRunner and workers are Ray actors,
which on a cluster see only what ``ray_kwargs.ray_init.runtime_env.env_vars`` carries, so the same variables go there
too (``overrides.worker_env``). Nothing here imports verl.
"""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from repro.child_signals import with_default_sigint
from repro.errors import ReproError

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe

ENTRY_MODULE = "verl.trainer.main_ppo"
DRIVER_ENV = {"PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "1", "RAY_DEDUP_LOGS": "0",
              "TOKENIZERS_PARALLELISM": "false"}


class VerlError(ReproError):
    """verl cannot be started from here, failed, or stopped before the recipe's last step."""


def interpreter(recipe: "Recipe") -> str:
    return str(Path(recipe.verl.python).expanduser()) if recipe.verl.python else sys.executable


def install_problems(recipe: "Recipe") -> list[str]:
    """What keeps verl from starting here (empty: nothing), each naming the field."""
    python = interpreter(recipe)
    if recipe.verl.python and not Path(python).is_file():
        return [f"verl.python: {python} is not a file (the interpreter of verl's image)"]
    if python == sys.executable:
        found = importlib.util.find_spec("verl") is not None
    else:
        found = subprocess.run([python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec("
                                "'verl') is None)"], capture_output=True).returncode == 0
    if not found:
        return [f"verl.python: verl is not importable by {python} (pip install 'verl[verl-core]==0.9.1', or run "
                "repro inside verl's image)"]
    if importlib.util.find_spec("hydra") is None:
        return ["verl: hydra-core is not importable here, so the config cannot be composed before the launch"]
    return []


def verl_command(recipe: "Recipe", overrides: list[str]) -> list[str]:
    return [interpreter(recipe), "-u", "-m", ENTRY_MODULE, *overrides]


def driver_env(recipe: "Recipe", worker_env: dict[str, str]) -> dict[str, str]:
    address = recipe.cluster.ray_address
    return {**DRIVER_ENV, **({"RAY_ADDRESS": address} if address and address != "auto" else {}), **worker_env}


def command_script(command: list[str], env: dict[str, str], cwd: Path) -> str:
    """verl as repro started it, to rerun by hand (kept as verl/command.sh)."""
    lines = ["#!/usr/bin/env bash", "# verl as repro started it (one attempt); rerun by hand from the Ray head.",
             "set -euo pipefail"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines += [f"cd {shlex.quote(str(cwd))}", shlex.join(with_default_sigint(command))]
    return "\n".join(lines) + "\n"
