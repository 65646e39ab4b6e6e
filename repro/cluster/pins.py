"""The software versions of AMD's cluster run, in one place (``repro check`` compares against these).

AMD's post: ROCm 7.2 and vLLM 0.25.1 on MI308X. torch is the project's own pin (read from the installed
package metadata, so pyproject.toml stays the one source); on the cluster the same version is the ROCm
build (``2.13.0+rocm7.2``), compared without its ``+local`` tag. megatron-core is not pinned by the post:
any installed version is reported, and only its absence fails.
"""

from __future__ import annotations

from importlib import metadata

VLLM = "0.25.1"
ROCM = "7.2"
MEGATRON_CORE: str | None = None  # AMD's post names no version; LumenRL's environment decides
TORCH_FALLBACK = "2.13.0"  # used only if the package metadata cannot be read (a source checkout not installed)


def project_pin(package: str, fallback: str | None = None) -> str | None:
    """The exact ``==`` pin of ``package`` in this project's dependencies, or ``fallback``."""
    try:
        requirements = metadata.requires("repro") or []
    except metadata.PackageNotFoundError:
        return fallback
    for requirement in requirements:
        name, sep, version = requirement.split(";")[0].partition("==")
        if sep and name.split("[")[0].strip().lower() == package.lower():
            return version.strip()
    return fallback


def cluster_pins() -> dict[str, str | None]:
    """Component -> version the cluster should run (None: any version, presence only)."""
    return {
        "torch": project_pin("torch", TORCH_FALLBACK),
        "rocm": ROCM,
        "vllm": VLLM,
        "megatron-core": MEGATRON_CORE,
    }
