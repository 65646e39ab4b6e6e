"""The verl lane (make test-verl): verl 0.9.1 and its Hydra in .venv-verl. Skipped where verl is not importable."""

import pytest

pytest.importorskip("verl", reason="verl lane: make test-verl builds .venv-verl with verl[verl-core]==0.9.1")
