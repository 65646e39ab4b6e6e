"""The comparison with AMD as Markdown: one source or several side by side, the notes on where a source's numbers
are not AMD's quantity, and the derived figures the post does not give. Written atomically (temp file + rename)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from repro.analysis import caveats, summary
from repro.analysis.compare import AMD_STEPS, compare_to_amd
from repro.analysis.compare_published import compare_to_published
from repro.analysis.formats import fmt
from repro.analysis.frame import STEP_SECONDS, RunFrames
from repro.owned import NotOurs, check_apart, write_atomic
from repro.reference import PublishedRun, amd_facts, published_run

TITLE = "comparison with AMD's DeepSeek-V4-Flash RL run (24 x MI308X)"
BANDS = ("Noise bands: phase means use the run's single-step spread / √n (×1.96); held-out accuracy uses a "
         "bootstrap over problems (10,000 resamples, seed 0, 95% percentile interval) and asks whether AMD's value "
         "lies inside the run's interval; throughput asks whether the run lies inside AMD's published 287-331 range.")
CPU_CAVEAT = ("**{who} a tiny CPU run: a mechanism check, not a replication.** It exercises every part of AMD's recipe "
              "(GRPO 32x8, FP8 rollout, TIS, R3, weight sync, avg@8 evaluation) on a ~2M-parameter model and a "
              "synthetic arithmetic task, so its accuracies, KL, ESS and throughput measure a different model on a "
              "different task on different hardware. Agreement or disagreement with AMD's numbers says nothing about "
              "whether the 284B run reproduces.")
AMD_NOTE = ("AMD's phase means are given as \"about\"/\"roughly\" whole percents; their own step-to-step noise is not "
            "published, so a band is drawn from the run's data only. KL and ESS have no published spread.")


def _is_nan(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _step_shown(row) -> bool:
    """Whether a value needs its step beside it: always for single-step extremes, for start/end values when the step
    is not AMD's (0 for start, 75 for end)."""
    if _is_nan(row.step):
        return False
    if row.metric.endswith(", start"):
        return int(row.step) != 0
    if row.metric.endswith(", end"):
        return int(row.step) != AMD_STEPS
    return True


def value_cell(row) -> str:
    """A source's value as a table cell: formatted in its quantity's format, its step where it is not AMD's, and the
    missing key where there is no value."""
    if _is_nan(row.run):
        return f"— (no `{row.key}`)" if row.note.startswith("no `") else "—"
    return fmt(row.run, row.quantity) + (f" (step {int(row.step)})" if _step_shown(row) else "")


def comparison_markdown(table: pd.DataFrame, reference: str = "AMD") -> str:
    """One source's long table: metric | AMD (or ``reference``) | this run | difference | noise band | inside | note."""
    lines = [f"| metric | {reference} | this run | difference | noise band | inside | note |",
             "|---|---|---|---|---|---|---|"]
    for r in table.itertuples(index=False):
        band = r.band if _is_nan(r.band_low) else (f"{fmt(r.band_low, r.quantity)} – {fmt(r.band_high, r.quantity)} "
                                                   f"({r.band})")
        inside = {True: "yes", False: "no", None: "—"}[r.inside]
        lines.append(f"| {r.metric} | {fmt(r.amd, r.quantity)} | {value_cell(r)} | "
                     f"{fmt(r.difference, r.quantity, signed=True)} | {band} | {inside} | {r.note} |")
    return "\n".join(lines)


def side_by_side_markdown(sources: list[RunFrames]) -> str:
    """metric | AMD | one column per source: each value in its quantity's format, the key a source lacked."""
    tables = [compare_to_amd(frames) for frames in sources]
    head = "| metric | AMD | " + " | ".join(frames.label for frames in sources) + " |"
    lines = [head, "|---" * (2 + len(sources)) + "|"]
    for i, first in enumerate(tables[0].itertuples(index=False)):
        cells = [value_cell(next(t.iloc[[i]].itertuples(index=False))) for t in tables]
        lines.append(f"| {first.metric} | {fmt(first.amd, first.quantity)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def derived_markdown(frames: RunFrames) -> list[str]:
    if STEP_SECONDS not in frames.train.columns:
        return [f"- No `{STEP_SECONDS}` column: time-to-train cannot be derived."]
    t = summary.time_to_train(frames, steps=AMD_STEPS)
    evals = ("included in the step times" if frames.step_time_includes_eval
             else f"added {fmt(t['eval_s_total'], 'seconds')} in all")
    lines = [f"- Mean step wall time: {fmt(t['step_s_mean'], 'seconds')} (median {fmt(t['step_s_median'], 'seconds')}) "
             f"over {int(t['steps_logged'])} logged steps; evaluation {evals}.",
             f"- Wall time logged: {t['hours_logged']:.2f} h; {AMD_STEPS} steps at the mean step time: "
             f"{t['hours_for_steps']:.2f} h."]
    if "devices" in t:
        lines.append(f"- {t['unit']}: {t['device_hours_per_step']:.3g} per step, {t['device_hours_for_steps']:.3g} "
                     f"for {AMD_STEPS} steps ({int(t['devices'])} {'GPUs' if t['unit'] == 'GPU-hours' else 'cores'}).")
        if t["unit"] == "core-hours":
            lines.append("  CPU recipes do not log a core count: the cores of the machine that ran this analysis "
                         "stand in for the run's, so core-hours are an estimate.")
    else:
        lines.append("- No recipe travels with an imported log: GPU-hours need a GPU count and are not given.")
    return lines


def _sources_table(sources: list[RunFrames]) -> list[str]:
    lines = ["| source | what | path | steps and evaluations |", "|---|---|---|---|"]
    for frames in sources:
        what = f"repro run, recipe {frames.recipe.name}" if frames.recipe is not None else f"{frames.kind} log"
        lines.append(f"| {frames.label} | {what} | `{frames.source}` | {caveats.describe_steps(frames)} |")
    return lines


def published_report(sources: list[RunFrames], reference: PublishedRun) -> str:
    """The report against another published run: what it was, its caveats, and each source's rows."""
    parts = [f"# {', '.join(f.label for f in sources)}: comparison with {reference.title}", "",
             f"Reference: {reference.source}, <{reference.url}>. AMD's run is the suite's default reference "
             "(`repro compare` without `--reference`).", "", "## The reference run, in its own words", ""]
    parts += [f"- \"{s}\"" if not s.startswith("launch command") else f"- {s}" for s in reference.setup] + [""]
    cpu = [f.label for f in sources if (hw := summary.hardware(f)) is not None and hw.gpus == 0]
    if cpu:
        who = f"{', '.join(cpu)} {'is' if len(cpu) == 1 else 'are'}"
        parts += ["> " + CPU_CAVEAT.format(who=who).replace("AMD's recipe", "the recipe")
                  .replace("AMD's numbers", "the reference's numbers").replace("the 284B run reproduces",
                                                                               "a 284B run would agree"), ""]
    parts += ["## Where its numbers are not this run's quantity", ""] + [f"- {c}" for c in reference.caveats] + [""]
    for frames in sources:
        parts += [f"Source `{frames.source}` ({frames.label}): {caveats.describe_steps(frames)}.", ""]
        parts += [comparison_markdown(compare_to_published(frames, reference), reference.name), ""]
    parts += ["Each reference number with the sentence it came from: "
              f"`repro/reference/` ({reference.name}); docs/published-runs.md lists the published runs.", ""]
    return "\n".join(parts)


def render_report(sources: RunFrames | list[RunFrames], reference: str = "amd") -> str:
    sources = [sources] if isinstance(sources, RunFrames) else list(sources)
    if reference != "amd":
        return published_report(sources, published_run(reference))
    single = len(sources) == 1
    first = sources[0]
    name = (first.recipe.name if first.recipe else first.label) if single else ", ".join(f.label for f in sources)
    cpu = [f.label for f in sources if (hw := summary.hardware(f)) is not None and hw.gpus == 0]
    who = "This is" if single else f"{', '.join(cpu)} {'is' if len(cpu) == 1 else 'are'}"
    parts = [f"# {name}: {TITLE}", ""]
    parts += ([f"Source: `{first.source}` ({first.label}): {caveats.describe_steps(first)}.", ""] if single
              else [*_sources_table(sources), ""])
    parts += [*(["> " + CPU_CAVEAT.format(who=who), ""] if cpu else []), f"> {AMD_NOTE}", ""]
    if not single:
        parts += ["## Side by side", "", side_by_side_markdown(sources), ""]
    parts += ["## Where the numbers are not AMD's quantity", "", f"- {caveats.KL_ESTIMATORS}", ""]
    for frames in sources:
        notes = caveats.source_notes(frames)
        parts += ([] if single else [f"**{frames.label}**", ""]) + [f"- {n}" for n in notes or ["none found"]] + [""]
    for frames in sources:
        parts += [f"## {'Metric by metric' if single else frames.label + ': metric by metric'}", "",
                  comparison_markdown(compare_to_amd(frames)), ""]
    parts += [BANDS, "", "## Derived figures the post does not give", ""]
    for frames in sources:
        parts += ([] if single else [f"**{frames.label}**", ""]) + derived_markdown(frames) + [""]
    parts += [f"AMD does not publish step time or time-to-train (only the run's dates, "
              f"{amd_value_dates()}, which include setup), so there is no AMD figure to compare these with.", ""]
    return "\n".join(parts)


def amd_value_dates() -> str:
    facts = amd_facts()
    return f"{facts['run_start']} to {facts['run_end']}"


def is_report_file(path: Path) -> bool:
    """A comparison this module wrote: its first line is one of the report's headings (against AMD's run, or
    "comparison with" another published run)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            first = handle.readline().rstrip("\n")
    except OSError:
        return False
    return first.startswith("# ") and (first.endswith(TITLE) or ": comparison with " in first)


def write_report(sources: RunFrames | list[RunFrames], path: str | Path, reference: str = "amd") -> Path:
    """Write the Markdown report (against ``reference``, AMD's run by default) atomically (temp file + rename). An
    existing file is replaced only when it is a comparison repro wrote, never a log it was read from nor a file of
    the user's (repro.owned)."""
    final = Path(path)
    frames = [sources] if isinstance(sources, RunFrames) else list(sources)
    flag = "name another file with --out"
    check_apart(final, [f.source for f in frames], flag)
    if final.is_symlink() or (final.exists() and not final.is_file()):
        raise NotOurs(f"{final}: exists and is not a file repro may write (a link or a folder); {flag}")
    if final.exists() and not is_report_file(final):
        raise NotOurs(f"{final}: exists and is not a comparison repro wrote (its first line is not "
                      f"'# ...{TITLE}'); nothing was replaced: {flag}")
    final.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(final, render_report(frames, reference))
