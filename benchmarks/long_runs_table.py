"""The tables of issue 31's closing note from tiny-cpu-long runs: learning by phase, where the step time goes, and
the mismatch by response position in LumenRL's buckets (whole run and by phase).

Make the runs (weights-only numerics: only the rollout's FP8 weights, no W8A8 / BF16 rounding / FP8 KV cache):
    repro run --recipe tiny-cpu-long --in-process --run-dir runs/drift/on-10086 --set seed=10086
    repro run --recipe tiny-cpu-long --in-process --run-dir runs/drift/wo-10086 --set seed=10086 \
        --set rollout.activation_quant=none --set rollout.activation_dtype=fp32 --set rollout.kv_cache_dtype=auto
then
    PYTHONPATH=$PWD .venv/bin/python benchmarks/long_runs_table.py on:10086=runs/drift/on-10086 wo:10086=...
Wall-clock figures are whatever the machine gave: say whether it was idle.
"""

from __future__ import annotations

import argparse

import pandas as pd

import tempfile

from repro.analysis import load_run
from repro.studies import mismatch_attribution as ma
from repro.analysis.frame import ACCURACY, ESS, K3_KL, KL, MetricsError
from repro.analysis.summary import mismatch_by_position, phase_means
from repro.recipes import resolve_path

PHASES = ((1, 25), (26, 50), (51, 75))
TIMINGS = ("rollout", "update", "sync", "reward", "rollouts_file", "step")


def learning_row(frames) -> dict:
    train = frames.train
    row = {f"phase {int(p)} acc %": 100 * float(v)
           for p, v in phase_means(frames.require(ACCURACY), 25)["mean"].items()}
    if "eval/avg@8" in frames.eval:
        row.update({f"avg@8 step {int(s)} %": 100 * float(v) for s, v in frames.eval["eval/avg@8"].dropna().items()})
    row.update({"k1": float(train[KL].mean()), "k3": float(train[K3_KL].mean()),
                "ESS %": 100 * float(train[ESS].mean()),
                "response tokens (mean)": float(train["response_length/mean"].mean())})
    return row


def timing_row(frames) -> dict:
    train = frames.train
    row = {f"{name} s (mean)": float(train[f"timing_s/{name}"].mean())
           for name in TIMINGS if f"timing_s/{name}" in train}
    row["sum of steps s"] = float(train["timing_s/step"].sum())
    row["rollout share %"] = 100 * float(train["timing_s/rollout"].sum() / train["timing_s/step"].sum())
    return row


def position_rows(label: str, frames) -> list[dict]:
    rows = []
    for span, (first, last) in [("1-75", (None, None))] + [(f"{a}-{b}", (a, b)) for a, b in PHASES]:
        table = mismatch_by_position(frames, first, last)
        for bucket, values in table.iterrows():
            rows.append({"run": label, "steps": span, "bucket": bucket, "tokens": values["tokens"],
                         "k1": values["kl"], "k3": values["k3_kl"], "|d|": values["abs_diff"]})
    return rows


def fine_rows(label: str, run_dir: str, step: int, prompts: int, n: int, seeds: list[int], width: int) -> list[dict]:
    """k1 / k3 / |d| per ``width``-token bucket on a fixed batch sampled from the run's checkpoint of ``step``,
    rescored with every numeric on and with the FP8 weights only (``mismatch_attribution``)."""
    frames = load_run(run_dir)
    rows = tuple(a for a in ma.ATTRIBUTION if a.label in ("all on (the run)", "weights only"))
    out = []
    with tempfile.TemporaryDirectory(prefix="repro-fine-") as folder:
        model = ma.checkpoint_model(run_dir, step, folder, resolve_path(frames.recipe.model.path))
        for seed in seeds:
            for row in ma.attribute(frames.recipe, model, prompts, n, seed, width, rows)["positions"]:
                out.append({"run": label, "rescored as": row["config"], "seed": seed, "start": row["start"],
                            "tokens": row["tokens"], "k1": row["k1"], "k3": row["k3"], "|d|": row["abs_diff"],
                            "indexer": row["indexer_disagree"], "routing": row["routing_flip"]})
    return out


def _order(value: str) -> int:
    """Sort key: the whole run first, then the phases; buckets by their start."""
    return -1 if value == "1-75" else int(value.replace("–", "-").split("-")[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="LABEL=RUN_DIR")
    parser.add_argument("--fine-step", type=int, metavar="STEP",
                        help="also rescore a fixed batch from each run's checkpoint of STEP in --width-token buckets")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    learning, timing, positions = {}, {}, []
    for spec in args.runs:
        label, _, run_dir = spec.partition("=")
        if not run_dir:
            parser.error(f"{spec!r}: expected LABEL=RUN_DIR")
        try:
            frames = load_run(run_dir)
        except MetricsError as err:
            parser.error(f"{spec}: {err}")
        learning[label], timing[label] = learning_row(frames), timing_row(frames)
        positions += position_rows(label, frames)
    pd.set_option("display.width", 220)
    print(pd.DataFrame(learning).round(4).to_string(), end="\n\n")
    print(pd.DataFrame(timing).round(3).to_string(), end="\n\n")
    table = pd.DataFrame(positions).sort_values(["steps", "bucket"], key=lambda c: c.map(_order), kind="stable")
    table = table.set_index(["steps", "bucket", "run"])
    print(table.to_string(float_format=lambda x: f"{x:.3e}" if abs(x) < 1 else f"{x:.0f}"))
    if args.fine_step is None:
        return
    fine = []
    for spec in args.runs:
        label, _, run_dir = spec.partition("=")
        fine += fine_rows(label, run_dir, args.fine_step, args.prompts, args.n, args.seeds, args.width)
    frame = pd.DataFrame(fine)
    frame[["k1", "k3", "|d|", "indexer", "routing"]] = frame[["k1", "k3", "|d|", "indexer", "routing"]].mul(
        frame["tokens"], axis=0)
    grouped = frame.groupby(["rescored as", "run", "start"], sort=False)[
        ["tokens", "k1", "k3", "|d|", "indexer", "routing"]].sum()
    grouped[["k1", "k3", "|d|", "indexer", "routing"]] = grouped[["k1", "k3", "|d|", "indexer", "routing"]].div(
        grouped["tokens"], axis=0)
    print(f"\nfixed batch from each run's step-{args.fine_step} checkpoint, seeds {args.seeds}, token-weighted:")
    print(grouped.to_string(float_format=lambda x: f"{x:.3e}" if abs(x) < 1 else f"{x:.0f}"))


if __name__ == "__main__":
    main()
