"""AMD's published numbers as data, each with the sentence it came from (see the YAML beside this file)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

REFERENCE_FILE = Path(__file__).resolve().parent / "amd_dsv4_flash_mi308x.yaml"


@dataclass(frozen=True)
class Reference:
    """One published number. Fractions for percentages; ``approx`` where the source says "about"."""

    key: str
    value: float
    quote: str
    approx: bool = False
    unit: str = ""
    step: int | None = None
    steps: tuple[int, int] | None = None


@lru_cache(maxsize=1)
def amd_reference() -> dict[str, Reference]:
    raw = yaml.safe_load(REFERENCE_FILE.read_text())
    out = {}
    for key, item in raw["metrics"].items():
        steps = item.get("steps")
        out[key] = Reference(
            key=key,
            value=item["value"],
            quote=item["quote"],
            approx=bool(item.get("approx", False)),
            unit=item.get("unit", ""),
            step=item.get("step"),
            steps=tuple(steps) if steps else None,
        )
    return out


@lru_cache(maxsize=1)
def amd_facts() -> dict[str, object]:
    return dict(yaml.safe_load(REFERENCE_FILE.read_text())["facts"])


def amd_value(key: str) -> float:
    return amd_reference()[key].value
