"""One page per run: ``<out>/index.html`` with the comparison with AMD, the four figures, the caveats, and links to
the executed notebooks (as HTML) and the raw records; `repro report` and the last step of `make repro` write it.

The page itself needs nothing beside it: the tables and caveats are the Markdown report of repro.analysis.report
rendered to HTML, the figures are embedded as SVG data (the bytes ``repro figures`` writes), the style is inline.
The executed notebooks are converted with nbconvert's HTMLExporter into ``<out>/notebooks/<source>/`` so the folder
can be served or zipped as it is; the raw records (metrics.jsonl, the evaluations, an imported log) are linked
where they lie, relative to the page. Everything is built in a temp folder beside ``<out>`` and renamed into place:
a failure leaves the previous report, or none, never half of one.

An existing ``<out>`` is replaced only when it is a report this command wrote (it holds ``.repro-report.json``;
a page written before that marker existed is recognised by its footer, with nothing but the page and its
notebooks beside it) and is neither a source, a folder holding one, nor a run folder (repro.owned); otherwise
the command refuses, naming the folder, and touches nothing.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from repro.analysis.frame import METRICS_FILE, RECIPE_FILE, MetricsError, RunFrames
from repro.analysis.report import render_report
from repro.analysis.sources import default_output_dir, load_sources
from repro.errors import ReproError
from repro.reference import published_run
from repro.analysis.plots import FIGURES, figure_bytes
from repro.owned import check_replaceable

REPORT_DIR = "report"
PAGE = "index.html"
NOTEBOOKS = "notebooks"
MARKER = ".repro-report.json"  # what shows a folder is a report repro wrote (and may replace)
FOOTER = "Written by <code>repro report</code>."
STYLE = """
body { font: 15px/1.5 system-ui, sans-serif; color: #1b1b1b; margin: 0; }
main { max-width: 1100px; margin: 0 auto; padding: 1rem 1.5rem 3rem; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; font-size: 13px; }
th, td { border: 1px solid #c8c8c8; padding: 0.2rem 0.5rem; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
blockquote { margin: 0.5rem 0; padding: 0.1rem 1rem; border-left: 4px solid #ed1c24; background: #fdf3f3; }
code { font-size: 90%; background: #f3f3f3; padding: 0 0.2rem; }
figure { margin: 1rem 0 2rem; }
figure img { max-width: 100%; height: auto; }
figcaption, .missing, footer { color: #555; font-size: 13px; }
"""


class ReportError(ReproError):
    """An executed notebook could not be converted, or the report folder could not be written."""


@dataclass(frozen=True)
class Link:
    text: str
    href: str
    note: str = ""


def render_markdown(text: str) -> str:
    """Markdown to HTML with tables; raw HTML in it (a label, a path) is escaped, never passed through."""
    import mistune  # comes with nbconvert (JupyterLab); its renderer is the one nbconvert uses for notebooks

    return mistune.create_markdown(escape=True, plugins=["table"])(text)


def embedded_figures(sources: list[RunFrames]) -> tuple[dict[str, str], dict[str, str]]:
    """({figure name: its SVG as a data: URI}, {figure name: why it is missing}) for AMD's four charts."""
    shown, missing = {}, {}
    for name, plot in FIGURES.items():
        try:
            fig = plot(sources)
        except MetricsError as err:
            missing[name] = str(err)
            continue
        shown[name] = "data:image/svg+xml;base64," + base64.b64encode(figure_bytes(fig, "svg")).decode("ascii")
    return shown, missing


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_") or "source"


def _href(target: Path, page_dir: Path) -> str:
    return quote(Path(os.path.relpath(target.absolute(), page_dir.absolute())).as_posix())


def run_dir_of(frames: RunFrames) -> Path | None:
    """The run directory of a repro run (the folder of its metrics.jsonl and recipe.yaml), else None."""
    folder = frames.source if frames.source.is_dir() else frames.source.parent
    return folder if frames.kind == "repro" and (folder / METRICS_FILE).is_file() else None


def executed_notebooks(frames: RunFrames) -> list[Path]:
    """The executed notebooks a repro run holds (``RUN/notebooks/*.ipynb``, what the chain writes), in name order."""
    run_dir = run_dir_of(frames)
    return sorted((run_dir / NOTEBOOKS).glob("*.ipynb")) if run_dir is not None else []


def convert_notebook(path: Path, out: Path, exporter=None) -> Path:
    """``path`` as a standalone HTML page (nbconvert's HTMLExporter: outputs, images and style inside it). Pass one
    ``exporter`` for several notebooks: building it (loading its templates) costs more than converting one."""
    if exporter is None:
        from nbconvert import HTMLExporter

        exporter = HTMLExporter()
    try:
        body, _ = exporter.from_filename(str(path))
    except Exception as err:  # nbformat raises several kinds for a corrupt file; all of them name no file
        raise ReportError(f"{path}: not a readable notebook ({type(err).__name__}: {err})") from None
    out.write_text(body, encoding="utf-8")
    return out


def raw_records(frames: RunFrames, page_dir: Path) -> list[Link]:
    """Links to what a source's numbers were read from: a repro run's log, recipe, evaluations and the other
    records it keeps; an imported log itself."""
    run_dir = run_dir_of(frames)
    if run_dir is None:
        return [Link(frames.source.name or str(frames.source), _href(frames.source, page_dir),
                     f"the {frames.kind} log this page was made from")]
    about = ((METRICS_FILE, "one JSON row per step and per evaluation"),
             ("metrics.parquet", "the same rows as a table"), (RECIPE_FILE, "the resolved recipe"),
             ("comparison.md", "the run's comparison with AMD as Markdown (repro compare)"))
    links = [Link(name, _href(run_dir / name, page_dir), note) for name, note in about if (run_dir / name).is_file()]
    links += [Link(f"eval/{p.name}", _href(p, page_dir), "per-problem results of one evaluation")
              for p in sorted((run_dir / "eval").glob("*.json"))]
    links += [Link(f"notebooks/{p.name}", _href(p, page_dir), f"what {p.name.split('.')[0]} recorded")
              for p in sorted((run_dir / NOTEBOOKS).glob("*.results.json"))]
    for folder, note in (("rollouts", "every step's trajectories"), ("logs", "the run's logs")):
        if (run_dir / folder).is_dir():
            links.append(Link(f"{folder}/", _href(run_dir / folder, page_dir), note))
    return links


def _links_html(links: list[Link]) -> str:
    items = [f'<li><a href="{link.href}">{html.escape(link.text)}</a>'
             + (f" — {html.escape(link.note)}" if link.note else "") + "</li>" for link in links]
    return "<ul>\n" + "\n".join(items) + "\n</ul>"


def render_page(sources: list[RunFrames], figures: dict[str, str], missing: dict[str, str],
                notebooks: dict[str, list[Link]], records: dict[str, list[Link]], reference: str = "amd") -> str:
    """The page: the Markdown report against ``reference`` (tables, caveats, derived figures), the figures,
    notebooks and raw records."""
    markdown = render_report(sources, reference)
    title = markdown.splitlines()[0].removeprefix("# ")  # the report's own heading: "<run>: comparison with AMD's ..."
    parts = [render_markdown(markdown), "<h2>Figures</h2>"]
    for name, uri in figures.items():
        caption = (FIGURES[name].__doc__ or name).split("\n\n")[0]
        parts.append(f'<figure id="figure-{name}"><img src="{uri}" alt="{html.escape(name)}">'
                     f"<figcaption>{html.escape(' '.join(caption.split()))}</figcaption></figure>")
    parts += [f'<p class="missing">{html.escape(name)} not drawn: {html.escape(why)}</p>'
              for name, why in missing.items()]
    parts.append("<h2>Executed notebooks</h2>")
    if not any(notebooks.values()):
        parts.append("<p>No executed notebooks: only a repro run directory holds them (RUN/notebooks/, written by "
                     "<code>make repro</code> or <code>repro notebooks</code>).</p>")
    for label, links in notebooks.items():
        if links:
            parts += [f"<h3>{html.escape(label)}</h3>", _links_html(links)]
    parts.append("<h2>Raw records</h2>")
    for label, links in records.items():
        parts += [f"<h3>{html.escape(label)}</h3>", _links_html(links)]
    parts.append(f"<footer><p>{FOOTER} The page holds its tables and figures; the "
                 "notebooks are in the notebooks/ folder beside it, the raw records are linked where they lie."
                 "</p></footer>")
    body = "\n".join(parts)
    return (f'<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<main>\n{body}\n</main>\n"
            f"</body>\n</html>\n")


def is_report_folder(folder: Path) -> bool:
    """A folder ``repro report`` wrote: its marker, or (a page from before the marker) an index.html with the
    report's footer and nothing beside it but the notebooks' HTML."""
    try:
        about = json.loads((folder / MARKER).read_text())
        if isinstance(about, dict) and about.get("written_by") == "repro report":
            return True
    except (OSError, ValueError):
        pass
    entries = {p.name for p in folder.iterdir()}
    if not entries <= {PAGE, NOTEBOOKS} or not (folder / PAGE).is_file():
        return False
    notebooks = folder / NOTEBOOKS
    if notebooks.exists() and (notebooks.is_symlink() or any(
            p.is_symlink() or (p.is_file() and p.suffix != ".html") for p in notebooks.rglob("*"))):
        return False
    try:
        return FOOTER in (folder / PAGE).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def source_paths(frames: list[RunFrames]) -> list[Path]:
    """What the sources were read from: each log (or export folder) and each repro run's folder."""
    return [d for d in (run_dir_of(f) for f in frames) if d is not None] + [f.source for f in frames]


def write_report_page(sources, out_dir: str | Path | None = None, reference: str = "amd", **source_options) -> Path:
    """Load the sources (run sources or frames, one or a list), build the report folder and return its index.html.
    ``out_dir`` defaults to ``<first repro run>/report`` (else runs/compare/report); ``reference``: the published run
    the tables set them beside (repro.reference.PUBLISHED; AMD's by default). A source that cannot be read, an
    unknown reference, or an ``out_dir`` that is not a report repro wrote (module docstring), raises before anything
    is written."""
    published_run(reference)
    frames = load_sources(sources, **source_options)
    final = Path(out_dir) if out_dir is not None else default_output_dir(frames) / REPORT_DIR
    check_replaceable(final, ours=is_report_folder, what="report", marker=MARKER, sources=source_paths(frames),
                      flag="name another folder with --out", inside_ok=True)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        umask = os.umask(0o022)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # a folder as mkdir makes it (mkdtemp's is private to its owner)
    except OSError as err:
        raise ReportError(f"{final}: could not write the report ({err})") from None
    old = None
    try:
        _build(frames, tmp, final, reference)
        if final.exists():  # a report repro wrote (checked above): aside until the new one is in place
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
            final.rename(old)  # over the empty folder just made: a name no one else holds
        try:
            tmp.rename(final)
        except OSError:
            if old is not None:  # put the previous report back rather than leave none
                old.rename(final)
                old = None
            raise
    except OSError as err:
        raise ReportError(f"{final}: could not write the report ({err})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # made above, by this call
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)  # the previous report, moved aside by this call
    return final / PAGE


def _build(frames: list[RunFrames], tmp: Path, final: Path, reference: str = "amd") -> None:
    """Write the page and the notebooks' HTML into ``tmp``, with links as they will read from ``final``."""
    figures, missing = embedded_figures(frames)
    for name, why in missing.items():
        warnings.warn(f"figure {name} not drawn: {why}", stacklevel=3)
    notebooks, records, exporter = {}, {}, None
    for f in frames:
        folder = tmp / NOTEBOOKS / _slug(f.label)
        notebooks[f.label] = []
        for path in executed_notebooks(f):
            if exporter is None:
                from nbconvert import HTMLExporter

                exporter = HTMLExporter()
            folder.mkdir(parents=True, exist_ok=True)
            page = convert_notebook(path, folder / f"{path.stem}.html", exporter)
            notebooks[f.label].append(Link(path.stem, _href(final / page.relative_to(tmp), final)))
        records[f.label] = raw_records(f, final)
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / PAGE).write_text(render_page(frames, figures, missing, notebooks, records, reference), encoding="utf-8")
    about = {"written_by": "repro report", "sources": [str(f.source) for f in frames]}
    (tmp / MARKER).write_text(json.dumps(about, indent=1) + "\n", encoding="utf-8")
