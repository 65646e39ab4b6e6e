"""Record the LumenRL lines docs/fidelity.md cites, from a checkout at 2232f55, for tests/test_fidelity_citations.py
(not a timed test: it needs the checkout; the test runs without it).

    python benchmarks/lumenrl_citations.py /path/to/Lumen-RL [--record tests/data/lumenrl/cited_lines.json]

Every ``SHORT:LINE`` or ``SHORT:FIRST–LAST`` in the doc (SHORT as its "Where AMD sets it" table names the file) is
checked against the file at the checked-out commit: the file must exist and hold the lines. With ``--record`` the
index written holds each file's line count and sha256 and each cited line's text, so a reader sees what a citation
points at, and the test fails on a citation the index does not hold (one added without reading the line).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
from pathlib import Path

from repro import REPO_DIR

DOC = REPO_DIR / "docs" / "fidelity.md"
CITATION = re.compile(r"\b([A-Z]{1,2}):(\d+)(?:[–-](\d+))?")
COMMIT = "2232f55"


def short_names(text: str) -> dict[str, str]:
    """SHORT -> file path, from the doc's "| short | file |" table."""
    section = text.split("| short | file |", 1)[1].split("\n\n", 1)[0]
    return {m[1]: m[2] for m in re.finditer(r"^\| (\w+) \| `([^`]+)` \|", section, flags=re.M)}


def citations(text: str, shorts: dict[str, str]) -> list[tuple[str, int, int]]:
    """(SHORT, first line, last line) of every citation in the doc's table rows, in order, without repeats."""
    found = []
    for line in text.splitlines():
        if line.startswith("|"):
            for m in CITATION.finditer(line):
                if m[1] in shorts:
                    item = (m[1], int(m[2]), int(m[3] or m[2]))
                    if item not in found:
                        found.append(item)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", type=Path)
    parser.add_argument("--record", type=Path)
    args = parser.parse_args()
    head = subprocess.run(["git", "-C", str(args.checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0 and not head.stdout.startswith(COMMIT):
        raise SystemExit(f"{args.checkout} is at {head.stdout.strip()[:12]}, the doc cites {COMMIT}")
    text = DOC.read_text()
    shorts = short_names(text)
    files, lines, bad = {}, {}, []
    for short, first, last in citations(text, shorts):
        path = args.checkout / shorts[short]
        if not path.is_file():
            bad.append(f"{short} ({shorts[short]}): no such file")
            continue
        content = path.read_text().splitlines()
        files[shorts[short]] = {"lines": len(content), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        if not 1 <= first <= last <= len(content):
            bad.append(f"{short}:{first}-{last}: {shorts[short]} has {len(content)} lines")
            continue
        for number in sorted({first, last}):
            lines[f"{short}:{number}"] = content[number - 1].strip()
            print(f"{short}:{number:<5} {content[number - 1].strip()[:100]}")
    if bad:
        raise SystemExit("\n".join(bad))
    if args.record:
        tmp = args.record.with_name(args.record.name + ".tmp")
        tmp.write_text(json.dumps({"lumenrl": f"ZhangDanyang-AMD/Lumen-RL dev/dsv4-grpo {COMMIT}", "files": files,
                                   "cited_lines": lines}, indent=1, ensure_ascii=False) + "\n")
        tmp.replace(args.record)
        print(f"recorded {len(lines)} cited lines of {len(files)} files in {args.record}")


if __name__ == "__main__":
    main()
