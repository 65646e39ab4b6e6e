"""The software a recipe's cluster runs (``recipe.cluster.versions``) and how a version found here is compared with it.

The versions live in the recipe, not in the project's own pins: the laptop installs exact versions from
constraints/laptop.txt, AMD's images carry theirs (Python 3.12, ROCm torch 2.11, vLLM 0.25.1, Ray 2.56.1;
docs/amd-images.md), and `repro check` on a cluster node must judge the image, not this laptop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe


def expected_versions(recipe: "Recipe") -> dict[str, str | None]:
    """Component -> the version the recipe's cluster runs (None: any version, only reported)."""
    versions = recipe.cluster.versions
    return {"python": versions.python, "torch": versions.torch, "rocm": versions.rocm, "vllm": versions.vllm,
            "ray": versions.ray, "transformers": versions.transformers, "megatron-core": versions.megatron_core,
            "lumenrl": versions.lumenrl, "transformer-engine": None}  # TE: any version megatron-core accepts


def base_version(version: str) -> str:
    """Without the local tag: '2.11.0+gitd0c8b1f' -> '2.11.0'."""
    return version.split("+")[0]


def version_matches(found: str, expected: str) -> bool:
    """Dotted-prefix match without local tags: '7.2.1' matches '7.2', '2.11.0+gitd0c8b1f' matches '2.11.0',
    '3.12.13' matches '3.12'; '2.11.0' does not match '2.1'."""
    have, want = base_version(found).split("."), base_version(expected).split(".")
    return have[:len(want)] == want
