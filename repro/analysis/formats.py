"""One number format per quantity, used by every table, sentence and notebook of the analysis.

  fraction       accuracies, avg@k, effective sample size   "79.1%"      difference "+1.2 pt"
  tokens_per_s   rollout throughput                          "311.0"      difference "+4.2"
  kl             KL estimates (AMD quotes 0.4706)            "0.4706"     4 significant digits, so 1.2e-05 stays visible
  seconds        wall time                                   "2.13 s"
  step           optimizer steps                             "75"
Missing values print as "—".
"""

from __future__ import annotations

import math

import pandas as pd

QUANTITIES = ("fraction", "tokens_per_s", "kl", "seconds", "step")


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


def fmt(value, quantity: str, signed: bool = False) -> str:
    """``value`` as a string in its quantity's format; ``signed`` for differences (fractions become points)."""
    if quantity not in QUANTITIES:
        raise ValueError(f"quantity {quantity!r}: expected one of {', '.join(QUANTITIES)}")
    if _missing(value):
        return "—"
    value = float(value)
    if quantity == "fraction":
        return f"{value * 100:+.1f} pt" if signed else f"{value * 100:.1f}%"
    if quantity == "tokens_per_s":
        return f"{value:+.1f}" if signed else f"{value:.1f}"
    if quantity == "kl":
        return f"{value:+.4g}" if signed else f"{value:.4g}"
    if quantity == "seconds":
        return f"{value:+.2f} s" if signed else f"{value:.2f} s"
    return f"{int(round(value)):+d}" if signed else f"{int(round(value))}"


def percent(value) -> str:
    return fmt(value, "fraction")


def step(value) -> str:
    return fmt(value, "step")


def formatted(table: pd.DataFrame, quantities: dict[str, str]) -> pd.DataFrame:
    """A copy of ``table`` with the named columns as strings in their quantity's format (for display)."""
    out = table.copy()
    for column, quantity in quantities.items():
        if column in out.columns:
            out[column] = [fmt(v, quantity) for v in out[column]]
    return out


def formatted_rows(table: pd.DataFrame, quantities: dict[str, str]) -> pd.DataFrame:
    """A copy of ``table`` whose rows (by index label) are strings in their quantity's format: for tables with one
    quantity per row (this run vs AMD, metric by metric)."""
    out = table.astype(object).copy()
    for row, quantity in quantities.items():
        if row in out.index:
            out.loc[row] = [fmt(v, quantity) for v in table.loc[row]]
    return out
