"""The comparison report: one number format per quantity, several sources side by side (a missing metric names the
key the source lacked), and the notes on where a source's numbers are not AMD's quantity."""

import json
import math
from pathlib import Path

import pytest

from repro.analysis import compare_sources, compare_to_amd, load_run, load_sources
from repro.analysis.caveats import rollout_logprobs, source_notes
from repro.analysis.compare import LOGPROB_MARKS, compare_positions
from repro.analysis.formats import fmt, formatted_rows
from repro.analysis.report import render_report, side_by_side_markdown, write_report
from repro.analysis.synthetic import write_synthetic_run

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def stopped_short(tmp_path_factory):
    """A 75-step recipe whose log ends at step 40 (killed, not resumed)."""
    run_dir = write_synthetic_run(tmp_path_factory.mktemp("short") / "short", steps=75, seed=2)
    log = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows if r["step"] <= 40))
    return load_run(run_dir)


@pytest.fixture(scope="module")
def three(stopped_short):
    return [stopped_short] + load_sources(["lumenrl=tests/data/lumenrl/train.log",
                                           "wandb:tests/data/wandb/panel_*.csv"],
                                          base=DATA.parent.parent)


def test_one_format_per_quantity():
    assert (fmt(0.791, "fraction"), fmt(-0.016, "fraction", signed=True)) == ("79.1%", "-1.6 pt")
    assert (fmt(75.0, "step"), fmt(40, "step"), fmt(3, "step", signed=True)) == ("75", "40", "+3")
    assert (fmt(0.4706, "kl"), fmt(1.2345e-05, "kl"), fmt(-0.0007, "kl", signed=True)) == \
        ("0.4706", "1.234e-05", "-0.0007")
    assert (fmt(311, "tokens_per_s"), fmt(2.125, "seconds"), fmt(math.nan, "kl"), fmt(None, "step")) == \
        ("311.0", "2.12 s", "—", "—")
    with pytest.raises(ValueError, match="quantity 'percent'"):
        fmt(0.5, "percent")
    import pandas as pd
    table = pd.DataFrame({"run": [0.9998, 75.0], "AMD": [0.791, 75.0]}, index=["ess", "at step"])
    assert formatted_rows(table, {"ess": "fraction", "at step": "step"}).to_dict("list") == \
        {"run": ["100.0%", "75"], "AMD": ["79.1%", "75"]}  # not "0.9998" and "75.000000"


def test_a_run_stopped_short_says_which_step_end_is(stopped_short):
    table = compare_to_amd(stopped_short).set_index("metric")
    end = table.loc["held-out avg@k, end"]  # killed before its step-50 evaluation: the last one is step 25's
    assert (end["step"], end["note"]) == (25, "30 problems; step 25, AMD's is step 75")
    # a repro run's rollout log-probs are the recipe's (rollout.logprobs_mode); AMD's were raw: marked where not
    mark = LOGPROB_MARKS.get(rollout_logprobs(stopped_short), "")
    assert table.loc["effective sample size, end", "note"] == "; ".join(
        filter(None, ["run ends at step 40, AMD's value is at step 75", mark]))
    assert table.loc["reward accuracy, steps 26-50", "note"] == "only 15 of 25 steps logged"
    assert math.isnan(table.loc["reward accuracy, steps 51-75", "run"])
    notes = source_notes(stopped_short)
    assert notes[0] == "The run stopped at step 40, short of its recipe's 75 steps."
    text = render_report(stopped_short)
    assert "| effective sample size, end | 79.1% | " in text and "(step 40)" in text
    assert "The run stopped at step 40, short of its recipe's 75 steps." in text


def test_one_evaluation_is_a_start_or_an_end_never_both(tmp_path):
    run_dir = write_synthetic_run(tmp_path / "early", steps=75, seed=3)
    log = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows if r["step"] <= 21))  # killed before step 25's eval
    frames = load_run(run_dir)
    table = compare_to_amd(frames).set_index("metric")
    assert table.loc["held-out avg@k, start", "step"] == 0
    end = table.loc["held-out avg@k, end"]
    assert math.isnan(end["run"]) and end["note"] == "one evaluation only: no evaluation after step 0"
    assert "Evaluated at step 0; AMD publishes step 1 and step 75 only." in source_notes(frames)
    lumenrl = load_sources(str(DATA / "lumenrl" / "train.log"))[0]
    lumenrl.eval = lumenrl.eval.loc[[5]]
    table = compare_to_amd(lumenrl).set_index("metric")
    assert table.loc["held-out avg@k, start", "note"] == ("one evaluation only: none by step 1, AMD's start (the "
                                                           "evaluation after the first update)")
    assert table.loc["held-out avg@k, end", "step"] == 5


def test_three_sources_side_by_side_name_what_each_lacks(three):
    labels = [f.label for f in three]
    assert labels == ["short", "lumenrl", "wandb"]
    wide = compare_sources(three)
    assert list(wide.columns) == ["quantity", "AMD", *labels]
    assert wide.loc["rollout tokens/s, mean", "lumenrl"] == pytest.approx(306.5)
    assert math.isnan(wide.loc["rollout tokens/s, mean", "wandb"])
    rows = {line.split(" | ")[0].strip("| "): line for line in side_by_side_markdown(three).splitlines()}
    assert rows["held-out avg@k, start"] == "| held-out avg@k, start | 30.0% | " + \
        f"{fmt(three[0].eval.iloc[0]['eval/avg@8'], 'fraction')} | 30.0% (step 5) | — (no `eval/avg@k`) |"
    assert rows["rollout tokens/s, mean"].endswith("| 306.5 | — (no `perf/rollout_tokens_per_s`) |")
    assert rows["train-rollout KL, k1 estimator, end"].endswith("| -0.0007 (step 12) | -0.0007 (step 10) |")
    assert rows["train-rollout KL, k3 estimator, end"].endswith("| 0.0021 (step 12) | — (no `rollout_corr/k3_kl`) |")


def test_notes_say_where_a_source_is_not_amds_quantity(three):
    short, lumenrl, panels = (source_notes(f) for f in three)
    assert "Evaluated at steps 0, 25; AMD publishes step 1 and step 75 only." in short
    assert any(n.startswith("`perf/rollout_tokens_per_s` is generated tokens/s of this CPU run") for n in short)
    assert lumenrl[:2] == ["12 steps logged, fewer than AMD's 75: \"end\" values are step 12's, and the 25-step phases "
                           "after step 12 are partial or empty.",
                           "Evaluated at steps 5, 10; AMD publishes step 1 and step 75 only."]
    assert ("\"start\" is step 5, after 5 updates; AMD's is the evaluation after the first update (step 1: LumenRL "
            "never evaluates before it).") in lumenrl
    assert ("\"start\" is step 0, before any update; AMD's is the evaluation after the first update (step 1: "
            "LumenRL never evaluates before it).") in short
    assert "No per-problem correct counts: held-out accuracy has no bootstrap band." in lumenrl
    assert any("LumenRL's `throughput/gen_tok_per_s`" in n and "no per-GPU figure" in n for n in lumenrl)
    assert any(n.startswith("LumenRL's `mismatch/k3_kl`, `mismatch/chi2_token` are computed on π_rollout/π_trainer")
               for n in lumenrl)
    assert "No rollout throughput (`perf/rollout_tokens_per_s`): the throughput rows are empty." in panels
    assert "No held-out evaluations: the held-out rows are empty." in panels


def test_the_report_of_three_sources(tmp_path, three):
    text = write_report(three, tmp_path / "comparison.md").read_text()
    assert text.startswith("# short, lumenrl, wandb: comparison with AMD's DeepSeek-V4-Flash RL run")
    assert "| source | what | path | steps and evaluations |" in text
    assert "| lumenrl | lumenrl log | `" in text and "12 steps (1–12), evaluations at 5, 10" in text
    assert "**short is a tiny CPU run: a mechanism check, not a replication.**" in text
    for heading in ("## Side by side", "## short: metric by metric", "## lumenrl: metric by metric",
                    "## wandb: metric by metric", "## Where the numbers are not AMD's quantity"):
        assert heading in text
    assert "`rollout_corr/kl` is the k1 estimator" in text and "AMD's 0.4706 is k1" in text
    assert not list(tmp_path.glob(".*.tmp"))


def test_kl_cells_are_marked_where_the_rollout_log_probs_are_not_amds_or_not_known(three):
    """AMD's KL and ESS set the trainer's log_softmax(logits / T) against vLLM's raw log-probs (T = 1): a LumenRL log
    is that quantity; a W&B export does not say, and its cells say so instead of standing beside AMD's silently."""
    _, lumenrl, _ = three
    assert rollout_logprobs(lumenrl) == "raw"
    assert compare_to_amd(lumenrl).set_index("metric").loc["train-rollout KL, k1 estimator, end", "note"] == \
        "run ends at step 12, AMD's value is at step 75; k1 can be negative"
    export = load_sources(str(DATA / "wandb" / "eval_positions_history.csv"))[0]
    assert rollout_logprobs(export) is None
    row = compare_to_amd(export).set_index("metric").loc["train-rollout KL, k1 estimator, end"]
    assert row["note"].endswith("; the source does not say whether its rollout log-probs were raw, as AMD's, or "
                                "processed")
    assert any(n.startswith("The source does not say whether its rollout log-probs were raw or processed")
               for n in source_notes(export))
    assert not any("rollout log-probs" in n for n in source_notes(lumenrl))


def test_kl_by_position_is_compared_bucket_by_bucket_with_every_missing_cell_marked(three):
    _, lumenrl, _ = three
    positions = load_sources(str(DATA / "lumenrl" / "eval_positions.log"))[0]
    table = compare_positions([positions, lumenrl], stat="kl", step=2)
    ours = table[table["source"] == "eval_positions"].set_index("bucket")
    assert ours.loc["0-127", "value"] == positions.train.loc[2, "rollout_corr/pos_0_127/kl"]
    # no tokens past 2,047 at step 2: the bucket was not logged, and the cell says whose value stands there
    assert (ours.loc["2048-4095", "step"], ours.loc["2048-4095", "note"]) == (10, "not logged at step 2: step 10's")
    theirs = table[table["source"] == "lumenrl"]
    assert theirs["value"].isna().all() and (theirs["note"] == "no `" + theirs["key"] + "` in this source").all()
    assert "No KL by response position (`rollout_corr/pos_*`) in this source" in " ".join(source_notes(lumenrl))
