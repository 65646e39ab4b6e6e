"""repro: reproduce AMD's RL run of DeepSeek-V4-Flash (284B MoE) on 24 MI308X GPUs.

The same code path runs the published recipe on a cluster (Ray + Megatron-core + vLLM) and a tiny genuine
DeepSeek-V4 on a laptop CPU. See README.md for the two commands and the folder layout.
"""

from pathlib import Path

__version__ = "0.1.0"

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
