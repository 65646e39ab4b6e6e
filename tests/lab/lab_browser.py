"""What a person does with a notebook in JupyterLab, done through Playwright in Debian's Chromium.

Open the notebook, type new values into its parameters cell, choose Run > Run All Cells, wait for the kernel to
go idle, then read the page: each cell's prompt, its outputs (error/stderr text, HTML tables, images and SVGs).
A failure names the notebook, the cell and its first line, and keeps a screenshot.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from repro.notebooks import notebook_path

RUN_ALL_TIMEOUT_MS = 300_000
KERNEL_DISPLAY_NAME = "repro (.venv)"  # `make lab` installs the project kernel under this name
ERROR_PATTERN = re.compile(r"Traceback|\b[A-Z]\w*(Error|Exception)\b")

# one pass over the page: for each cell, in order, what a person would see
READ_CELLS_JS = """
() => Array.from(document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell')).map(cell => {
  const prompt = cell.querySelector('.jp-InputArea-prompt');
  const outputs = Array.from(cell.querySelectorAll('.jp-OutputArea-output'));
  const line = cell.querySelector('.cm-content .cm-line');
  return {
    code: cell.classList.contains('jp-CodeCell'),
    prompt: prompt ? prompt.textContent.trim() : '',
    first_line: line ? line.textContent : '',
    stderr: outputs.filter(o => o.dataset.mimeType === 'application/vnd.jupyter.stderr').map(o => o.textContent),
    text: outputs.map(o => o.textContent).join('\\n'),
    tables: cell.querySelectorAll('.jp-OutputArea-output table').length,
    figures: Array.from(cell.querySelectorAll('.jp-OutputArea-output img'))\
.filter(i => i.complete && i.naturalWidth > 0).length
             + cell.querySelectorAll('.jp-OutputArea-output svg').length,
  };
})
"""


PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the notebook on screen
PANEL_JS = f"document.querySelector('{PANEL}')"
FIRST_PROMPT_JS = f"{PANEL_JS}.querySelector('.jp-CodeCell .jp-InputArea-prompt')"
SETTLED_JS = f"""() => {{
  const panel = {PANEL_JS};
  const busy = Array.from(panel.querySelectorAll('.jp-InputArea-prompt')).some(p => p.textContent.includes('*'));
  const indicator = panel.querySelector('.jp-Notebook-ExecutionIndicator');
  return !busy && indicator !== null && indicator.dataset.status === 'idle';
}}"""


class LabFailure(AssertionError):
    """A notebook did not run cleanly in the browser; the message names notebook, cell and screenshot."""


@dataclass
class CellView:
    index: int
    code: bool
    prompt: str
    first_line: str
    stderr: list[str]
    text: str
    tables: int
    figures: int


@dataclass
class NotebookView:
    name: str
    cells: list[CellView]
    screenshot: Path
    errors: list[str] = field(default_factory=list)
    failed_cells: list[int] = field(default_factory=list)

    def cells_with_tables(self) -> set[int]:
        return {c.index for c in self.cells if c.tables}

    def cells_with_figures(self) -> set[int]:
        return {c.index for c in self.cells if c.figures}

    def text(self) -> str:
        return "\n".join(c.text for c in self.cells)


def parameters_cell(name: str) -> tuple[int, str]:
    """(index, source) of the notebook's cell tagged ``parameters``, as committed."""
    cells = json.loads(notebook_path(name).read_text())["cells"]
    for index, cell in enumerate(cells):
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            return index, "".join(cell["source"])
    raise LabFailure(f"notebook {name}: no cell tagged 'parameters'")


def edited_parameters(source: str, values: dict[str, str]) -> str:
    """The parameters cell with each named assignment's value replaced by a string literal, comments kept."""
    lines, missing = source.splitlines(), set(values)
    for i, line in enumerate(lines):
        match = re.match(r"(\w+)(\s*=\s*)(\"[^\"]*\"|'[^']*'|[^#\s]+)(.*)", line)
        if match and match.group(1) in values:
            lines[i] = f"{match.group(1)}{match.group(2)}{json.dumps(values[match.group(1)])}{match.group(4)}"
            missing.discard(match.group(1))
    if missing:
        raise LabFailure(f"parameters cell has no assignment to {', '.join(sorted(missing))}:\n{source}")
    return "\n".join(lines)


def open_notebook(page, url: str, name: str) -> None:
    """Open notebooks/<name>.ipynb in a fresh workspace (``reset``: no notebook of an earlier page reopens and
    starts its kernel) and wait until its kernel has started and is idle. ``url`` carries the server's token."""
    base, _, token = url.partition("?")
    page.goto(f"{base}/lab/tree/{name}.ipynb?reset" + (f"&{token}" if token else ""))
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").first.wait_for(timeout=120_000)
    idle_kernel(page).wait_for(timeout=120_000)


def idle_kernel(page):
    """The status bar's kernel item once it reads "repro (.venv) | Idle": the project kernel `make lab` installs,
    started and connected. Before that (it reads "Initializing") JupyterLab drops a Run All with a notification,
    leaving every cell unrun."""
    return page.locator("#jp-main-statusbar").get_by_text(re.compile(rf"^{re.escape(KERNEL_DISPLAY_NAME)} \| Idle$"))


def type_parameters(page, name: str, values: dict[str, str]) -> str:
    """Select the parameters cell's text and type the edited cell over it, as a person would; return what is typed."""
    index, source = parameters_cell(name)
    wanted = edited_parameters(source, values)
    editor = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").nth(index).locator(
        ".cm-content")
    editor.click()
    page.keyboard.press("Control+a")
    page.keyboard.insert_text(wanted)
    page.keyboard.press("Escape")
    shown = editor.inner_text().replace("\u00a0", " ").rstrip("\n")
    if shown != wanted:
        raise LabFailure(f"notebook {name}: the parameters cell reads\n{shown}\nafter typing\n{wanted}")
    return wanted


def run_all_cells(page) -> None:
    """Run > Run All Cells from the menu bar, then wait until no cell is queued or running and the kernel is idle."""
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    # the cells are queued asynchronously after the click: first wait until the first code cell has been taken
    page.wait_for_function(f"() => {{ const p = {FIRST_PROMPT_JS}; return p && p.textContent.trim() !== '[ ]:'; }}",
                           timeout=60_000, polling=200)
    for _ in range(2):  # idle with nothing queued, seen twice a second apart (not a gap between two cells)
        page.wait_for_function(SETTLED_JS, timeout=RUN_ALL_TIMEOUT_MS, polling=500)
        page.wait_for_timeout(1000)


def read_notebook(page, name: str, screenshot: Path) -> NotebookView:
    """What the page shows after a run; every code cell must have run (a number in its prompt) without error."""
    cells = [CellView(i, **c) for i, c in enumerate(page.evaluate(READ_CELLS_JS))]
    view = NotebookView(name, cells, screenshot)
    after_error = []  # Run All stops at an error: the cells it left are named once, not one by one
    for cell in (c for c in cells if c.code):
        where = f"notebook {name}: cell {cell.index} ({cell.first_line!r})"
        errors = [text for text in cell.stderr if ERROR_PATTERN.search(text)]
        ran = re.fullmatch(r"\[\d+\]:", cell.prompt) is not None
        if errors:
            view.errors.append(f"{where} shows an error:\n{last_lines(errors[-1])}")
        elif ran:
            continue
        elif view.failed_cells:
            after_error.append(str(cell.index))
            continue
        else:
            view.errors.append(f"{where} did not run (prompt {cell.prompt!r})")
        view.failed_cells.append(cell.index)
    if after_error:
        view.errors.append(f"notebook {name}: cells {', '.join(after_error)} did not run after it")
    return view


def last_lines(text: str, n: int = 6) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return "\n".join("    " + line for line in lines[-n:])


def run_in_browser(page, url: str, name: str, values: dict[str, str], screenshots: Path) -> NotebookView:
    """Open ``name``, type ``values`` into its parameters cell, run all cells; raise LabFailure on any error.

    The screenshot ``<screenshots>/<name>.png`` is kept either way: the notebook at its last cell, or at the first
    cell that failed; each figure's output is also kept as ``<name>.cell<index>.png``."""
    screenshots.mkdir(parents=True, exist_ok=True)
    shot = screenshots / f"{name}.png"
    try:
        open_notebook(page, url, name)
        if values:  # none: the notebook runs on its committed defaults, untouched
            type_parameters(page, name, values)
        run_all_cells(page)
    except LabFailure:
        page.screenshot(path=str(shot))
        raise
    except Exception as err:  # a timeout or a missing element: say where, keep what the page showed
        page.screenshot(path=str(shot))
        raise LabFailure(f"notebook {name}: {type(err).__name__}: {str(err).splitlines()[0]} "
                         f"(screenshot: {shot})") from err
    page.screenshot(path=str(shot))
    view = read_notebook(page, name, shot)
    cells = page.locator(f"{PANEL} .jp-Notebook .jp-Cell")
    if view.errors:  # the screenshot shows the first cell that failed, not the end of the notebook
        cells.nth(view.failed_cells[0]).scroll_into_view_if_needed()
        page.screenshot(path=str(shot))
        raise LabFailure("\n".join(view.errors) + f"\n  screenshot: {shot}")
    for index in sorted(view.cells_with_figures()):  # each figure as the page drew it
        cells.nth(index).locator(".jp-OutputArea-output").last.screenshot(
            path=str(shot.with_name(f"{name}.cell{index}.png")))
    return view
