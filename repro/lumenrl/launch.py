"""Starting LumenRL on the Ray head as ``examples/GRPO/run_grpo_dsv4.sh`` does, and stopping it cleanly.

What the script does, and what we do instead (read in the script on branch dev/dsv4-grpo):

- it exports the ROCm / vLLM / RCCL environment below, then runs ``python3 -u -m lumenrl.trainer.main --config
  FILE key=value ...`` from the checkout with its output redirected to a log: so do we (:func:`lumenrl_env`,
  :func:`lumenrl_command`), with the config written from the recipe and the log at ``logs/lumenrl.log``;
- it runs ``ray stop --force`` unless ``LUMENRL_KEEP_RAY_CLUSTER=1``: we keep the cluster ``ray start`` built unless
  the recipe asks (``lumenrl.ray_stop_first``), as LumenRL's own multi-node runbook does;
- it SIGKILLs every process on the machine whose command line contains ``lumenrl.trainer.main``, ``EngineCore``,
  ``spawn_main``, ``multiprocessing.resource_tracker`` ...: that would hit other users' jobs and our own notebook
  kernel's helpers, so we never match by name. LumenRL runs in a process group of its own; we record it, stop only
  it, and end a group a killed earlier launch of this run left behind (matched by pid *and* start time);
- it patches the image's flash-attn wrapper file in place: we do not edit the image (docs/cluster-walkthrough.md).

Stopping: SIGINT first (LumenRL's ``main`` turns it into ``trainer.cleanup()``, which shuts its vLLM replicas down),
then SIGTERM, then SIGKILL, each after a grace period, always to LumenRL's group only. LumenRL starts with SIGINT at its
default even where we were started with it ignored (``nohup ... &``): see repro/child_signals.py.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from repro.child_signals import with_default_sigint
from repro.errors import ReproError
from repro.process_group import (  # noqa: F401 (LumenRL's names for them, used by repro.lumenrl.run and tests)
    STOP_GRACE_S, EngineProcess, end_recorded_process, live_members, record_process, start_process, stop_group,
)

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe

ENTRY_MODULE = "lumenrl.trainer.main"
# run_grpo_dsv4.sh's exports, set as it sets them (the ones it writes as ${X:-default} are in ENV_DEFAULTS)
ENV_FIXED = {
    "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "HYDRA_FULL_ERROR": "1",
    "PYTORCH_ALLOC_CONF": "expandable_segments:True", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "NCCL_TIMEOUT": "7200", "NCCL_CUMEM_ENABLE": "0", "HIP_FORCE_DEV_KERNARG": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    "RAY_DEDUP_LOGS": "0", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    # vLLM's rollout sees all 8 GPUs of its node; LumenRL pins each trainer worker to one GPU itself
    "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1", "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1",
    "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES": "1",
    "LUMENRL_LOG_LEVEL": "INFO", "LUMEN_DISABLE_HF_ATTN_PATCH": "1", "TORCHDYNAMO_DISABLE": "1",
    "HSA_OVERRIDE_GFX_VERSION": "9.4.2", "USE_ROCM_AITER_ROPE_BACKEND": "0",
    "VLLM_USE_V1": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_LOGGING_LEVEL": "ERROR",
    "ATOM_DISABLE_VLLM_PLUGIN": "1", "LUMENRL_KEEP_RAY_CLUSTER": "1",
}
ENV_DEFAULTS = {  # AMD's NIC names among them: a value already in the environment (or in lumenrl.env) wins
    "NCCL_IB_DISABLE": "0", "NCCL_SOCKET_IFNAME": "benic7p1", "NCCL_IB_HCA": "ionic_0", "NCCL_IB_GID_INDEX": "3",
    "NCCL_DMABUF_ENABLE": "0", "NCCL_DEBUG": "VERSION", "NCCL_DEBUG_SUBSYS": "INIT", "WANDB_CONSOLE": "off",
    "LUMENRL_DEBUG": "0", "VLLM_ROCM_USE_AITER": "1", "HSA_NO_SCRATCH_RECLAIM": "0",
    "HSA_DISABLE_FRAGMENT_ALLOCATOR": "0",
}


class LumenRLError(ReproError):
    """LumenRL cannot be started from here, failed, or stopped before the recipe's last step."""


def checkout_dir(recipe: "Recipe") -> Path:
    return Path(recipe.lumenrl.path).expanduser().resolve()


def base_config_path(recipe: "Recipe") -> Path:
    base = Path(recipe.lumenrl.base_config).expanduser()
    return base if base.is_absolute() else checkout_dir(recipe) / base


def checkout_problems(recipe: "Recipe") -> list[str]:
    """What is missing on this machine to start LumenRL (empty: nothing), each naming the field and path."""
    checkout = checkout_dir(recipe)
    if not checkout.is_dir():
        return [f"lumenrl.path: {checkout} is not a folder (the Lumen-RL checkout, branch dev/dsv4-grpo)"]
    problems = []
    entry = checkout / (ENTRY_MODULE.replace(".", "/") + ".py")
    if not entry.is_file():
        problems.append(f"lumenrl.path: {checkout} has no {entry.relative_to(checkout)} (not a LumenRL checkout?)")
    if not base_config_path(recipe).is_file():
        problems.append(f"lumenrl.base_config: {base_config_path(recipe)} not found")
    return problems


def lumen_dir(recipe: "Recipe") -> Path:
    """Lumen beside the checkout (run_grpo_dsv4.sh: $RL_ROOT/Lumen), else the checkout's third_party/Lumen."""
    if recipe.lumenrl.lumen_path:
        return Path(recipe.lumenrl.lumen_path).expanduser().resolve()
    beside = checkout_dir(recipe).parent / "Lumen"
    return beside if (beside / "lumen" / "config.py").is_file() else checkout_dir(recipe) / "third_party" / "Lumen"


def lumenrl_env(recipe: "Recipe", environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables LumenRL is started with on top of ``environ`` (the script's, then lumenrl.env)."""
    environ = dict(os.environ if environ is None else environ)
    checkout = checkout_dir(recipe)
    paths = [str(checkout), str(checkout / "miles_shim"), str(lumen_dir(recipe))]
    env = {**{k: v for k, v in ENV_DEFAULTS.items() if k not in environ}, **ENV_FIXED,
           "MODEL_NAME": recipe.model.path,
           "PYTHONPATH": os.pathsep.join(paths + ([environ["PYTHONPATH"]] if environ.get("PYTHONPATH") else []))}
    torch_spec = importlib.util.find_spec("torch")  # found without importing torch
    if torch_spec is not None and torch_spec.submodule_search_locations:
        torch_lib = Path(list(torch_spec.submodule_search_locations)[0]) / "lib"
        env["LD_LIBRARY_PATH"] = os.pathsep.join([str(torch_lib)] + ([environ["LD_LIBRARY_PATH"]]
                                                                      if environ.get("LD_LIBRARY_PATH") else []))
    address = recipe.cluster.ray_address
    if address and address != "auto":
        env["RAY_ADDRESS"] = address
    return {**env, **recipe.lumenrl.env}


def lumenrl_command(recipe: "Recipe", config_path: Path) -> list[str]:
    """``python -u -m lumenrl.trainer.main --config FILE`` + the recipe's LumenRL overrides. This interpreter: repro
    is installed into the image's Python (docs/amd-images.md), the one LumenRL runs with."""
    return [sys.executable, "-u", "-m", ENTRY_MODULE, "--config", str(config_path), *recipe.lumenrl.overrides]


def command_script(command: list[str], env: dict[str, str], cwd: Path) -> str:
    """A bash script that starts LumenRL by hand exactly as a run did (kept as lumenrl/command.sh)."""
    lines = ["#!/usr/bin/env bash", "# LumenRL as repro started it; rerun by hand from the Ray head.",
             "set -euo pipefail"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines += [f"cd {shlex.quote(str(cwd))}",
              "# through a launcher that sets SIGINT to its default (`nohup ... &` starts it ignored, and SIGINT is",
              "# what makes LumenRL clean up): see repro/child_signals.py",
              shlex.join(with_default_sigint(command))]
    return "\n".join(lines) + "\n"


def ray_stop() -> None:
    """`ray stop --force` on this node (only when the recipe asks: it ends every Ray process here)."""
    ray = Path(sys.executable).with_name("ray")
    subprocess.run([str(ray) if ray.is_file() else "ray", "stop", "--force"], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# -- its process group: repro.process_group, shared with the other engines that launch a program of their own ----

LumenRLProcess = EngineProcess
start_lumenrl = start_process  # LumenRL's stdout and stderr in one file, as the script's ``> $LOG 2>&1``
