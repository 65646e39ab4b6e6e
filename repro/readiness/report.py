"""How `repro check` results are shown (one summary line, a table) and saved (JSON for notebook 00)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from repro.readiness.types import FAIL, PASS, SKIP, WARN, CheckResult, cpu_mode, kind_name

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe


def failed(results: list[CheckResult]) -> bool:
    return any(r.status == FAIL for r in results)


def summary_line(recipe: "Recipe", results: list[CheckResult]) -> str:
    counts = {s: sum(r.status == s for r in results) for s in (PASS, WARN, FAIL, SKIP)}
    tally = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    mode = ("CPU mode: the tiny recipe needs no accelerator, GPU checks are skipped"
            if cpu_mode(recipe) else
            f"{recipe.cluster.num_nodes} nodes x {recipe.cluster.gpus_per_node} "
            f"{kind_name(recipe.cluster.accelerator)} GPUs expected")
    verdict = "NOT READY" if counts[FAIL] else "ready"
    return f"recipe {recipe.name} ({mode}): {verdict} — {tally}"


def format_table(results: list[CheckResult]) -> str:
    name_w = max(len("check"), *(len(r.check) for r in results))
    lines = [f"{'check':<{name_w}}  status  detail"]
    indent = " " * (name_w + 10)
    for r in results:
        lines.append(f"{r.check:<{name_w}}  {r.status:<6}  {r.detail}")
        if r.fix and r.status in (WARN, FAIL):
            lines.append(f"{indent}fix: {r.fix}")
    return "\n".join(lines)


NOTHING_TO_DO = "—"


def results_as_dicts(results: list[CheckResult]) -> list[dict[str, str]]:
    """One dict per check; ``fix`` says what to do for WARN/FAIL and is "—" where nothing needs doing."""
    return [{**asdict(r), "fix": r.fix if r.status in (WARN, FAIL) and r.fix else NOTHING_TO_DO} for r in results]


def write_json(results: list[CheckResult], path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(results_as_dicts(results), indent=2) + "\n")
    tmp.replace(path)
    return path
