"""Every notebook of the suite, once: its name, what it is, and where `make repro`'s chain runs it. The chain, the CLI,
the tests (the wheel test, the browser test) and the docs read this list; nothing else names the notebooks.

``wave``: the chain's waves -- no notebook reads what another of its wave writes, so a wave's notebooks run side by
side (``repro notebooks --parallel``), each wave when the one before has finished; the runs (02, 03) own the cores.
None: not in the chain (studies, run on their own: `make ablations`, `make mismatch-sources`).
``kind``: setup (the machine and the weights), run (trains), analysis (reads run sources given as ``source``),
study (runs models to measure something).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Notebook:
    name: str
    kind: Literal["setup", "run", "analysis", "study"]
    wave: int | None
    about: str


NOTEBOOKS: tuple[Notebook, ...] = (
    Notebook("00_cluster_check", "setup", 0, "is this machine (or Ray cluster) ready for the recipe"),
    Notebook("01_fp8_conversion", "setup", 0, "the BF16 checkpoint converted to block FP8, checked"),
    Notebook("02_smoke_run", "run", 1, "a 3-step run: every mechanism once"),
    Notebook("03_full_run", "run", 2, "the 75-step run with a live plot"),
    Notebook("10_reward_by_phase", "analysis", 3, "reward accuracy by 25-step phase against AMD's"),
    Notebook("11_aime", "analysis", 3, "held-out avg@8 at each evaluation"),
    Notebook("12_throughput", "analysis", 3, "rollout tokens/s and the time per phase of a step"),
    Notebook("13_kl_ess", "analysis", 3, "train-rollout KL and effective sample size"),
    Notebook("20_compare_to_amd", "analysis", 3, "the comparison table with AMD's numbers"),
    Notebook("14_ablations", "study", None, "R3 / TIS / cap ablations on the tiny recipe"),
    Notebook("15_mismatch_sources", "study", None, "the mismatch by numeric source and by position"),
)

WAVES: tuple[tuple[str, ...], ...] = tuple(
    tuple(n.name for n in NOTEBOOKS if n.wave == wave)
    for wave in sorted({n.wave for n in NOTEBOOKS if n.wave is not None}))
CHAIN: tuple[str, ...] = tuple(name for wave in WAVES for name in wave)
ANALYSIS: tuple[str, ...] = tuple(n.name for n in NOTEBOOKS if n.kind == "analysis")
RUNS: tuple[str, ...] = tuple(n.name for n in NOTEBOOKS if n.kind == "run")


def notebook_named(name: str) -> Notebook:
    for notebook in NOTEBOOKS:
        if notebook.name == name:
            return notebook
    raise KeyError(f"{name}: not a notebook of the suite ({', '.join(n.name for n in NOTEBOOKS)})")
