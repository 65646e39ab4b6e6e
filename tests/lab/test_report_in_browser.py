"""The report page as a person meets it: `repro report RUN` written, then opened as a file in Debian's Chromium (no
server), its tables read off the page against compare_to_amd, its four figures decoded by the browser, and a link to
an executed notebook followed to nbconvert's page of it. The screenshot stays in runs/lab-test/screenshots/."""

from __future__ import annotations

import shutil

from repro.analysis import compare_to_amd, load_run
from repro.analysis.formats import fmt
from repro.analysis.report import value_cell
from repro.cli import main
from repro.analysis.plots import FIGURE_NAMES

TABLES_JS = """
() => Array.from(document.querySelectorAll('table')).map(t => Array.from(t.rows).map(r =>
  Array.from(r.cells).map(c => c.innerText.trim())))
"""
IMAGES_JS = """
() => Array.from(document.images).map(i => ({alt: i.alt, drawn: i.complete && i.naturalWidth > 0,
                                            width: i.naturalWidth, data: i.src.startsWith('data:image/svg+xml')}))
"""
LONG_HEADER = ["metric", "AMD", "this run", "difference", "noise band", "inside", "note"]


def test_the_report_page_shows_its_tables_figures_and_notebooks_in_chromium(browser, small_run, lane_dir):
    from repro.notebooks import execute_notebook, venv_kernel_name

    # a copy of the lane's run, so the executed notebook written here never meets the walkthrough's results
    run = lane_dir / "report-run"
    shutil.copytree(small_run, run, ignore=shutil.ignore_patterns("checkpoints", "notebooks"))
    execute_notebook("10_reward_by_phase", run / "notebooks",
                     {"source": str(run), "out_dir": str(run / "notebooks"), "figures_dir": str(lane_dir / "figures")},
                     kernel_name=venv_kernel_name())
    assert main(["report", str(run)]) == 0
    page_path = run / "report" / "index.html"

    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    try:
        page = context.new_page()
        page.goto(page_path.as_uri())
        page.wait_for_load_state("load")
        tables = page.evaluate(TABLES_JS)
        long = [t for t in tables if t and t[0] == LONG_HEADER]
        assert len(long) == 1, [t[0] for t in tables]
        expected = compare_to_amd(load_run(run))
        shown = [[cells[0], cells[1], cells[2]] for cells in long[0][1:]]
        assert shown == [[r.metric, fmt(r.amd, r.quantity), value_cell(r).replace("`", "")]
                         for r in expected.itertuples(index=False)]
        images = page.evaluate(IMAGES_JS)
        assert [i["alt"] for i in images] == list(FIGURE_NAMES)
        assert all(i["drawn"] and i["data"] and i["width"] > 300 for i in images), images
        shot = lane_dir / "screenshots" / "report.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 50_000

        page.get_by_role("link", name="10_reward_by_phase", exact=True).click()
        page.wait_for_load_state("load")
        assert page.url == (run / "report" / "notebooks" / "report-run" / "10_reward_by_phase.html").as_uri()
        assert page.locator(".jp-Cell").count() > 3
        drawn = page.evaluate("() => Array.from(document.images).filter(i => i.complete && i.naturalWidth > 0).length"
                              " + document.querySelectorAll('.jp-OutputArea-output svg').length")
        assert drawn >= 1  # the notebook's figure, as nbconvert embedded it
        page.screenshot(path=str(shot.with_name("report.notebook-10.png")))
    finally:
        context.close()
