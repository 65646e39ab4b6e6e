"""The version rows of `repro check`: this host's software against the recipe's ``cluster.versions``.

A version that differs from the recipe is a WARN (the run may still work; the published numbers were measured on
the recipe's); a missing package the recipe needs, or a torch build for the wrong accelerator, is a FAIL. LumenRL is
reported (where it is, which commit) and only required when the recipe names a commit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from repro.readiness.pins import expected_versions, version_matches
from repro.readiness.types import FAIL, PASS, SKIP, WARN, Check, CheckResult, Facts, cpu_mode, kind_name, skipped
from repro.recipes.backends import MEGATRON_CORE, TRANSFORMER_ENGINE, VLLM, libraries

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe

INSTALL_IN_IMAGE = ("install repro into the image with `pip install -e .` "
                    "(it keeps the image's stack: docs/amd-images.md)")


def check_python(recipe: "Recipe", facts: Facts) -> CheckResult:
    want, have = expected_versions(recipe)["python"], facts.versions.get("python")
    if have is None:
        return CheckResult("python", WARN, "Python version unknown", "run `repro check` with the cluster's interpreter")
    if want and not version_matches(have, want):
        return CheckResult("python", WARN, f"Python {have}, the recipe's cluster runs {want}",
                           f"Ray needs one Python minor version on the driver and every node: run repro inside the "
                           f"image's Python {want}; {INSTALL_IN_IMAGE}")
    return CheckResult("python", PASS, f"Python {have}" + (f" = {want}" if want else " (recipe: any)"))


def check_torch(recipe: "Recipe", facts: Facts) -> CheckResult:
    want, have = expected_versions(recipe)["torch"], facts.versions.get("torch")
    if have is None:
        return CheckResult("torch", FAIL, "torch is not importable", "`make install` on a laptop; " + INSTALL_IN_IMAGE)
    build = "ROCm" if facts.versions.get("rocm_torch") else "CUDA" if facts.versions.get("cuda_torch") else "CPU"
    if not cpu_mode(recipe) and build.lower() != recipe.cluster.accelerator:
        return CheckResult("torch", FAIL, f"torch {have} is a {build} build, the recipe needs the "
                                          f"{kind_name(recipe.cluster.accelerator)} build",
                           f"use the {kind_name(recipe.cluster.accelerator)} image's torch {want or ''}".rstrip()
                           + (" (AMD: vllm/vllm-openai-rocm:v0.25.1)" if recipe.cluster.accelerator == "rocm" else ""))
    if want and not version_matches(have, want):
        return CheckResult("torch", WARN, f"torch {have}, the recipe's cluster runs {want}",
                           f"use torch {want} ({build} build) to match the recipe")
    return CheckResult("torch", PASS, f"torch {have} ({build} build)" + (f" = {want}" if want else " (recipe: any)"))


def check_platform(recipe: "Recipe", facts: Facts) -> CheckResult:
    """ROCm (the recipe's release) or CUDA (any) version, as the torch build and the system report it."""
    if cpu_mode(recipe):
        return skipped("rocm" if recipe.cluster.accelerator == "rocm" else "platform")
    want = expected_versions(recipe)["rocm"]
    if recipe.cluster.accelerator == "cuda":
        cuda = facts.versions.get("cuda_torch")
        if not cuda:
            return CheckResult("cuda", FAIL, "torch has no CUDA support", "install the CUDA build of torch")
        return CheckResult("cuda", PASS, f"CUDA {cuda} (torch build); AMD's run used ROCm 7.2")
    system, hip = facts.versions.get("rocm"), facts.versions.get("rocm_torch")
    if not system and not hip:
        return CheckResult("rocm", FAIL, f"no ROCm found (no /opt/rocm version file, torch has no HIP); the recipe "
                                         f"runs ROCm {want or 'any'}", "run on a node of the cluster, inside its image")
    seen = system or hip
    where = f"(system {system or '?'}, torch HIP {hip or '?'})"
    if want and not version_matches(seen, want):
        return CheckResult("rocm", WARN, f"ROCm {seen} {where}, the recipe's cluster runs {want}",
                           f"ROCm {want} is what the published numbers were measured on")
    return CheckResult("rocm", PASS, f"ROCm {seen} {where}" + (f" = {want}" if want else " (recipe: any)"))


def _check_package(name: str, key: str, needed_by, why_not: str, role: str) -> Check:
    """A library the recipe needs (with some backends only): FAIL when missing, WARN when another version."""
    def check(recipe: "Recipe", facts: Facts) -> CheckResult:
        if not needed_by(recipe):
            return CheckResult(name, SKIP, why_not)
        want, have = expected_versions(recipe)[key], facts.versions.get(key)
        if have is None:
            return CheckResult(name, FAIL, f"{key} is not installed; {role} needs it",
                               f"install {key}{' ' + want if want else ''} "
                               f"(the {kind_name(recipe.cluster.accelerator)} build) on every node")
        if want and not version_matches(have, want):
            return CheckResult(name, WARN, f"{key} {have}, the recipe's cluster runs {want}",
                               f"install {key}=={want} to match the recipe")
        return CheckResult(name, PASS, f"{key} {have}" + (f" = {want}" if want else " (recipe: any version)"))

    check.__name__ = f"check_{name}"
    return check


check_vllm = _check_package("vllm", "vllm", lambda r: VLLM in libraries(r),
                            "rollout.backend is embedded: vLLM is not used", "the recipe's rollout")
check_megatron = _check_package("megatron_core", "megatron-core", lambda r: MEGATRON_CORE in libraries(r),
                                "actor.backend is embedded: Megatron-core is not used", "the recipe's trainer")
check_transformer_engine = _check_package(
    "transformer_engine", "transformer-engine", lambda r: TRANSFORMER_ENGINE in libraries(r),
    "not needed: no megatron optimizer on the precision-aware path", "megatron-core's precision-aware optimizer")
# repro itself needs both everywhere (pyproject.toml); the recipe says which version its cluster runs
check_ray_version = _check_package("ray_version", "ray", lambda r: True, "", "repro")
check_transformers = _check_package("transformers", "transformers", lambda r: True, "", "repro")


def check_lumenrl(recipe: "Recipe", facts: Facts) -> CheckResult:
    """Where AMD's own engine is and which commit; required only when the recipe names a commit."""
    want = expected_versions(recipe)["lumenrl"]
    if facts.lumenrl_path is None:
        if want:
            return CheckResult("lumenrl", FAIL, f"LumenRL is not importable; the recipe expects commit {want}",
                               "use AMD's trainer image (LumenRL in /workspace/Lumen-RL) or put a checkout of "
                               "branch dev/dsv4-grpo on PYTHONPATH")
        return CheckResult("lumenrl", SKIP, "LumenRL not installed: only AMD's own engine needs it; its trainer "
                                            "image has it in /workspace/Lumen-RL")
    commit = facts.lumenrl_commit or "unknown (no git checkout, no SOURCE_VERSIONS record)"
    detail = f"LumenRL at {facts.lumenrl_path}, commit {commit}"
    if want and not (facts.lumenrl_commit or "").startswith(want):
        return CheckResult("lumenrl", WARN, f"{detail}; the recipe expects {want}",
                           f"`git -C {facts.lumenrl_path} checkout {want}` on every node")
    return CheckResult("lumenrl", PASS, detail + (f" = {want}" if want else ""))


VERSION_CHECKS: tuple[Check, ...] = (check_python, check_platform, check_torch, check_ray_version, check_transformers,
                                     check_vllm, check_megatron, check_transformer_engine, check_lumenrl)
