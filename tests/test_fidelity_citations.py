"""Every LumenRL `SHORT:LINE` docs/fidelity.md cites names a line that exists at 2232f55, without the network: the
lines were recorded from a checkout by benchmarks/lumenrl_citations.py (tests/data/lumenrl/cited_lines.json, each
file's line count and sha256, each cited line's text). A citation the index lacks -- added or renumbered without
reading the line -- fails until the index is recorded again from the checkout."""

from __future__ import annotations

import importlib.util
import json

from repro import REPO_DIR

SPEC = importlib.util.spec_from_file_location("lumenrl_citations", REPO_DIR / "benchmarks" / "lumenrl_citations.py")
citations_module = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(citations_module)
INDEX = json.loads((REPO_DIR / "tests/data/lumenrl/cited_lines.json").read_text())


def test_every_cited_line_exists_in_the_recorded_checkout():
    text = citations_module.DOC.read_text()
    shorts = citations_module.short_names(text)
    cited = citations_module.citations(text, shorts)
    assert len(shorts) >= 12 and len(cited) >= 100
    problems = []
    for short, first, last in cited:
        recorded = INDEX["files"].get(shorts[short])
        if recorded is None:
            problems.append(f"{short}: {shorts[short]} is not in the index")
            continue
        if not 1 <= first <= last <= recorded["lines"]:
            problems.append(f"{short}:{first}-{last}: {shorts[short]} has {recorded['lines']} lines at 2232f55")
        problems += [f"{short}:{n}: not in the recorded index" for n in {first, last}
                     if f"{short}:{n}" not in INDEX["cited_lines"]]
    assert not problems


def test_the_corrected_citations_point_at_what_the_table_says():
    lines = INDEX["cited_lines"]
    assert lines["CC:353"] == "adam_eps: float = 1e-8"                       # not CC:348, weight_decay
    assert lines["MR:103"] == "correct = pred == gt"                          # the answer check, not MR:102
    assert lines["T:1261"].startswith("def _load_val_dataset(")               # the evaluation loader
    assert lines["RC:399"].startswith('metrics["kl"] = _masked_mean(rollout_log_prob - old_log_prob')  # k1
    assert lines["T:4253"] == "p, gt = self._extract_prompt_gt(s, ensure_answer_format=True)"


def test_a_citation_past_the_file_end_is_caught():
    text = "| short | file |\n|---|---|\n| MR | `lumenrl/rewards/math_reward.py` |\n\n| a | MR:99999 |\n"
    shorts = citations_module.short_names(text)
    ((short, first, _),) = citations_module.citations(text, shorts)
    assert first > INDEX["files"][shorts[short]]["lines"]
