"""The report page (`repro report`, the chain's last step): its tables hold compare_to_amd's numbers, its figures
are the bytes `repro figures` writes, its links reach the executed notebooks (converted by nbconvert) and the raw
records, it works for several sources of different kinds, and bad input leaves no report folder behind."""

from __future__ import annotations

import base64
import math
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from repro.analysis import MetricsError, compare_to_amd, load_sources
from repro.analysis.caveats import source_notes
from repro.analysis.formats import fmt
from repro.analysis.report import value_cell
from repro.analysis.synthetic import write_synthetic_run
from repro.cli import main
from repro.analysis.plots import FIGURE_NAMES, make_all_figures
from repro.report_page import ReportError, write_report_page

ROOT = Path(__file__).parent.parent
DATA = Path(__file__).parent / "data"


class Page(HTMLParser):
    """What a reader of the page meets: its tables (rows of cell texts), images, links and text."""

    def __init__(self, text: str):
        super().__init__()
        self.tables, self.images, self.links, self.text = [], [], [], []
        self._cell = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "img":
            self.images.append((attrs.get("alt"), attrs["src"]))
        elif tag == "a":
            self.links.append(attrs["href"])

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def table(self, header: list[str]) -> list[list[str]]:
        found = [t[1:] for t in self.tables if t and t[0] == header]
        assert len(found) == 1, f"expected one table headed {header}, found {len(found)}"
        return found[0]

    def all_text(self) -> str:
        return " ".join("".join(self.text).split())


def shown(text: str) -> str:
    """A Markdown cell as the page shows it: code spans lose their backticks."""
    return text.replace("`", "")


def assert_same_number(cell: str, row) -> None:
    """The number a cell shows is the row's value rounded the way its quantity is formatted (half a unit of the
    last digit shown), so a table cell that drifted from compare_to_amd's value cannot pass."""
    if isinstance(row.run, float) and math.isnan(row.run):
        assert cell.startswith("—"), cell
        return
    number = re.match(r"-?[\d.]+(e[-+]\d+)?", cell).group(0)
    mantissa, _, exponent = number.partition("e")
    decimals = len(mantissa.partition(".")[2])
    scale = 100.0 if cell.startswith(number + "%") else 1.0
    half_unit = 0.5 * 10.0 ** (-decimals + (int(exponent) if exponent else 0)) / scale
    assert abs(float(number) / scale - row.run) <= half_unit * (1 + 1e-9), (cell, row.run)


def assert_comparison_table(rows: list[list[str]], frames, column: int = 2) -> None:
    expected = compare_to_amd(frames)
    assert [r[0] for r in rows] == expected["metric"].tolist()
    for cells, row in zip(rows, expected.itertuples(index=False)):
        assert cells[1] == fmt(row.amd, row.quantity)
        assert cells[column] == shown(value_cell(row))
        assert_same_number(cells[column], row)


def resolve(page: Path, href: str) -> Path:
    return (page.parent / unquote(href)).resolve()


def executed_notebook(path: Path, text: str) -> None:
    """A stand-in for an executed notebook of the chain (papermill's output): a Markdown cell, a code cell that
    ran, its printed output, and the recorded results JSON beside it."""
    nb = new_notebook(cells=[new_markdown_cell(f"# {path.stem}"),
                             new_code_cell("print(6 * 7)", execution_count=1,
                                           outputs=[new_output("stream", name="stdout", text=f"{text}\n")])])
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    path.with_name(f"{path.stem}.results.json").write_text('{"answer": 42}\n')


@pytest.fixture
def run_with_notebooks(tmp_path):
    run = write_synthetic_run(tmp_path / "tiny-run", steps=75, seed=4)
    for name in ("10_reward_by_phase", "20_compare_to_amd"):
        executed_notebook(run / "notebooks" / f"{name}.ipynb", f"forty-two from {name}")
    (run / "eval").mkdir()  # the synthetic run writes only metrics.jsonl; a run also keeps each evaluation's answers
    (run / "eval" / "step_000075.json").write_text('{"step": 75}\n')
    return run


def test_the_page_of_one_run_holds_its_numbers_figures_notebooks_and_records(run_with_notebooks, tmp_path):
    run = run_with_notebooks
    page_path = write_report_page(run)
    assert page_path == run / "report" / "index.html"
    page = Page(page_path.read_text())
    frames = load_sources(run)[0]

    assert_comparison_table(page.table(["metric", "AMD", "this run", "difference", "noise band", "inside", "note"]),
                            frames)
    text = page.all_text()
    for note in source_notes(frames):
        assert " ".join(shown(note).split()) in text
    assert "This is a tiny CPU run: a mechanism check, not a replication." in text

    written = {p.stem: p.read_bytes() for p in make_all_figures(run, tmp_path / "figures") if p.suffix == ".svg"}
    assert [alt for alt, _ in page.images] == list(FIGURE_NAMES)
    for alt, src in page.images:
        prefix = "data:image/svg+xml;base64,"
        assert src.startswith(prefix) and base64.b64decode(src[len(prefix):]) == written[alt]

    targets = {href: resolve(page_path, href) for href in page.links if not href.startswith("#")}
    assert all(target.exists() for target in targets.values()), targets
    notebooks = sorted(t for t in targets.values() if t.suffix == ".html")
    assert notebooks == [run / "report" / "notebooks" / "tiny-run" / f"{n}.html"
                         for n in ("10_reward_by_phase", "20_compare_to_amd")]
    for notebook in notebooks:  # nbconvert's page of the executed notebook: its code and its output
        body = notebook.read_text()
        assert "print" in body and f"forty-two from {notebook.stem}" in body
    records = {t for t in targets.values() if t.suffix != ".html"}
    assert {run / "metrics.jsonl", run / "recipe.yaml", run / "notebooks" / "10_reward_by_phase.results.json",
            run / "eval" / "step_000075.json"} <= records


def test_several_sources_of_different_kinds_on_one_page(tmp_path):
    run = write_synthetic_run(tmp_path / "short", steps=75, seed=2)
    sources = [str(run), "lumenrl=" + str(DATA / "lumenrl" / "train.log"),
               "wandb:" + str(DATA / "wandb" / "panel_*.csv")]
    page_path = write_report_page(sources, tmp_path / "out")
    page = Page(page_path.read_text())
    frames = load_sources(sources)
    labels = [f.label for f in frames]
    assert labels == ["short", "lumenrl", "wandb"]

    side = page.table(["metric", "AMD", *labels])
    for i, f in enumerate(frames):
        assert_comparison_table(side, f, column=2 + i)
    long_tables = [t[1:] for t in page.tables if t[0][:3] == ["metric", "AMD", "this run"]]
    assert len(long_tables) == 3
    for rows, f in zip(long_tables, frames):
        assert_comparison_table(rows, f)
    by_metric = {cells[0]: cells for cells in side}
    assert by_metric["held-out avg@k, end"][4] == "— (no eval/avg@k)"  # W&B panel exports hold no evaluations

    written = {p.stem: p.read_bytes() for p in make_all_figures(frames, tmp_path / "figures") if p.suffix == ".svg"}
    assert {alt: base64.b64decode(src.split(",", 1)[1]) for alt, src in page.images} == written
    assert len(written) == 4
    targets = [resolve(page_path, href) for href in page.links]
    assert (DATA / "lumenrl" / "train.log").resolve() in targets and (DATA / "wandb").resolve() in targets
    assert run / "metrics.jsonl" in targets
    assert "No executed notebooks" in page.all_text() and not (tmp_path / "out" / "notebooks").exists()


def test_a_missing_source_is_named_and_leaves_no_report_folder(tmp_path, capsys):
    run = write_synthetic_run(tmp_path / "run", steps=10, seed=1)
    missing = tmp_path / "logs" / "gone.log"
    out = tmp_path / "reports" / "report"
    with pytest.raises(MetricsError, match=re.escape(str(missing))):
        write_report_page([run, missing], out)
    assert not out.parent.exists()
    assert main(["report", str(run), str(missing), "--out", str(out)]) == 1
    assert str(missing) in capsys.readouterr().err and not out.parent.exists()
    with pytest.raises(MetricsError, match=r"bad_line\.log:16: LumenRL metrics line does not parse"):
        write_report_page(DATA / "lumenrl" / "bad_line.log", out)
    assert not out.parent.exists()


def test_a_corrupt_notebook_is_named_and_the_previous_report_stays_whole(run_with_notebooks):
    run = run_with_notebooks
    before = write_report_page(run).read_text()
    corrupt = run / "notebooks" / "11_aime.ipynb"
    corrupt.write_text('{"cells": [')  # a notebook cut off mid-write
    with pytest.raises(ReportError, match=re.escape(f"{corrupt}: not a readable notebook")):
        write_report_page(run)
    assert (run / "report" / "index.html").read_text() == before
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".report")) == []
    assert sorted(p.name for p in (run / "report" / "notebooks" / "tiny-run").iterdir()) == \
        ["10_reward_by_phase.html", "20_compare_to_amd.html"]


def test_a_label_cannot_inject_markup(tmp_path):
    run = write_synthetic_run(tmp_path / "run", steps=10, seed=1)
    page = write_report_page(f"<b>x<i>={run}", tmp_path / "out").read_text()
    assert "<b>x<i>" not in page and "&lt;b&gt;x&lt;i&gt;" in page
