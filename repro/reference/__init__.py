"""Published numbers as data, each with the sentence it came from (see the YAML files beside this file).

AMD's run (``amd``, the default everywhere) and the other published DeepSeek-V4 RL runs a run can be set beside
(``repro compare --reference NAME``): ``PUBLISHED`` names them. docs/published-runs.md lists what each measured and
what could not be found in the stored material.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from repro.errors import ReproError

REFERENCE_DIR = Path(__file__).resolve().parent
REFERENCE_FILE = REFERENCE_DIR / "amd_dsv4_flash_mi308x.yaml"
PUBLISHED = {"amd": "amd_dsv4_flash_mi308x.yaml", "miles-mi355x": "miles_mi355x_dsv4_flash.yaml",
             "verl-veomni": "verl_veomni_dsv4.yaml"}
MEASURES = ("eval_avg", "eval_pass_at_k", "mean_abs_logprob_diff", "reward_step_min", "reward_step_max", "kl",
            "k3_kl")


@dataclass(frozen=True)
class Reference:
    """One published number. Fractions for percentages; ``approx`` where the source says "about". ``measures``,
    ``at`` and ``k`` (other runs only) say which of a run's logs give the same quantity, and where."""

    key: str
    value: float
    quote: str
    approx: bool = False
    unit: str = ""
    step: int | None = None
    steps: tuple[int, int] | None = None
    measures: str = ""
    at: str | int | None = None
    k: int | None = None


@dataclass(frozen=True)
class PublishedRun:
    """A published run: what it was (``setup`` sentences), where it was published, its numbers and its caveats."""

    name: str
    title: str
    source: str
    url: str
    setup: tuple[str, ...]
    caveats: tuple[str, ...]
    metrics: dict[str, Reference]


def _references(path: Path, raw: dict) -> dict[str, Reference]:
    out = {}
    for key, item in raw["metrics"].items():
        steps = item.get("steps")
        measures = item.get("measures", "")
        if measures and measures not in MEASURES:
            raise ReproError(f"{path}: metrics.{key}.measures {measures!r} is not one of {MEASURES}")
        out[key] = Reference(key=key, value=item["value"], quote=item["quote"], approx=bool(item.get("approx", False)),
                             unit=item.get("unit", ""), step=item.get("step"), steps=tuple(steps) if steps else None,
                             measures=measures, at=item.get("at"), k=item.get("k"))
    return out


@lru_cache(maxsize=None)
def published_run(name: str) -> PublishedRun:
    """The published run called ``name`` (``PUBLISHED``); an unknown name is an error listing the known ones."""
    if name not in PUBLISHED:
        raise ReproError(f"--reference {name!r}: no such published run; known: {', '.join(PUBLISHED)}")
    path = REFERENCE_DIR / PUBLISHED[name]
    raw = yaml.safe_load(path.read_text())
    if name == "amd":
        return PublishedRun("amd", "AMD's DeepSeek-V4-Flash RL run (24 x MI308X)", raw["source"], "", (), (),
                            _references(path, raw))
    return PublishedRun(raw["name"], raw["title"], raw["source"], raw["url"], tuple(raw.get("setup", ())),
                        tuple(raw.get("caveats", ())), _references(path, raw))


def amd_reference() -> dict[str, Reference]:
    return published_run("amd").metrics


@lru_cache(maxsize=1)
def amd_facts() -> dict[str, object]:
    return dict(yaml.safe_load(REFERENCE_FILE.read_text())["facts"])


def amd_value(key: str) -> float:
    return amd_reference()[key].value
