"""Did a speed change change what the tiny run learns? Runs side by side, with the seed-to-seed spread as the yardstick.

Give labelled 75-step runs of the tiny recipe (``LABEL=RUN_DIR``, the label ``before`` / ``after`` then ``:seed``);
prints each run's 25-step phase means of reward accuracy, held-out avg@8 at every evaluation, the mean k3 KL and
ESS, the median step time, then per quantity the before-after change of each seed beside the spread between the
seeds of one side. A change inside the spread is seed noise.

Make the runs with the code to compare (the metrics of a Ray run and an in-process run of one seed are equal):
    repro run --recipe tiny-cpu --in-process --run-dir runs/learn/after-10086 --set seed=10086   (and --set seed=20251)
then
    PYTHONPATH=$PWD .venv/bin/python benchmarks/learning_check.py before:10086=DIR after:10086=DIR ...
"""

from __future__ import annotations

import argparse

import pandas as pd

from repro.analysis import load_run
from repro.analysis.summary import eval_table, mismatch_by_position, phase_means
from repro.analysis.frame import ACCURACY, ESS, K3_KL, KL, MetricsError
from repro.metric_keys import IS_FRACTION_HIGH

VERL_ESS = "rollout_corr_verl/rollout_is_eff_sample_size"


def summary(run_dir: str) -> dict:
    frames = load_run(run_dir)
    train = frames.train
    row = {f"phase{int(p)}": 100 * float(v) for p, v in phase_means(frames.require(ACCURACY), 25)["mean"].items()}
    evals = eval_table(frames)
    row.update({f"avg@8 step {int(step)}": 100 * float(avg) for step, avg in evals["avg"].items()})
    last = evals.index.max()
    row.update({"avg@8 last, band low": 100 * float(evals.loc[last, "low"]),
                "avg@8 last, band high": 100 * float(evals.loc[last, "high"])})
    row.update({"k1 KL": float(train[KL].mean()), "k3 KL": float(train[K3_KL].mean()),
                "ESS %": 100 * float(train[ESS].mean()),
                "above cap %": 100 * float(train[IS_FRACTION_HIGH].mean()),
                "step s (median)": float(train["timing_s/step"].median())})
    if VERL_ESS in train:  # a run with rollout_correction.verl_metrics: verl's ESS beside LumenRL's
        row["ESS % (verl's)"] = 100 * float(train[VERL_ESS].mean())
    try:
        by_position = mismatch_by_position(frames)
    except MetricsError:  # a run made before the position buckets were logged
        return row
    for bucket, values in by_position.iterrows():
        row.update({f"pos {bucket} k1": values["kl"], f"pos {bucket} k3": values["k3_kl"],
                    f"pos {bucket} |d|": values["abs_diff"]})
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="SIDE:SEED=RUN_DIR")
    args = parser.parse_args()
    rows = {}
    for spec in args.runs:
        label, _, run_dir = spec.partition("=")
        side, _, seed = label.partition(":")
        if not run_dir or not seed:
            parser.error(f"{spec!r}: expected SIDE:SEED=RUN_DIR, e.g. before:10086=runs/learn/before-10086")
        rows[(side, int(seed))] = summary(run_dir)
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.names = ["side", "seed"]
    pd.set_option("display.width", 200)
    print(table.round(4).T.to_string())
    sides = list(dict.fromkeys(table.index.get_level_values("side")))
    if len(sides) == 2:
        before, after = (table.xs(side, level="side") for side in sides)
        seeds = before.index.intersection(after.index)
        change = (after.loc[seeds] - before.loc[seeds]).T
        change.columns = [f"{sides[1]} - {sides[0]}, seed {s}" for s in seeds]
        spread = pd.concat({f"seed spread ({side})": table.xs(side, level="side").max()
                            - table.xs(side, level="side").min()
                            for side in sides}, axis=1)
        print("\nchange vs seed-to-seed spread:")
        print(pd.concat([change, spread], axis=1).round(4).to_string())


if __name__ == "__main__":
    main()
