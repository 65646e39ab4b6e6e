"""W&B CSV exports (history and panel) and verl/LumenRL JSONL map into the frames of our own log; bad files are
named by file and line. LumenRL's console log: tests/test_lumenrl_log.py."""

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from repro.analysis import MetricsError, compare_to_amd, summary
from repro.analysis.frame import TornLineWarning
from repro.analysis.importers import collapse_mirrors, frames_from_table, read_verl_jsonl, read_wandb_csv

DATA = Path(__file__).parent / "data"

HISTORY = """\
,_step,_runtime,_timestamp,training/global_step,critic/score/mean,response_length/mean,timing_s/gen,\
timing_s/update_actor,perf/throughput,rollout_corr/kl,val-core/aime_2024/acc/mean@8,val-aux/aime_2024/reward/mean@8,\
custom/thing
0,0,12.0,1.7e9,,,,,,,,0.3,-0.4,
1,1,60.0,1.7e9,1,-0.1,100,20.0,5.0,950.5,0.41,,,7
2,2,110.0,1.7e9,2,0.2,120,24.0,5.5,990.0,0.47,0.35,-0.3,8
"""


def test_wandb_history_export(tmp_path):
    path = tmp_path / "history.csv"
    path.write_text(HISTORY)
    frames = read_wandb_csv(path)
    train, evals = frames.train, frames.eval
    assert train.index.tolist() == [1, 2]  # step 0 holds only val metrics (and W&B's _runtime): no train row
    assert train["timing_s/rollout"].tolist() == [20.0, 24.0]  # timing_s/gen
    assert train["timing_s/update"].tolist() == [5.0, 5.5]  # timing_s/update_actor
    assert train["reward/accuracy"].tolist() == pytest.approx([0.45, 0.6])  # (score + 1) / 2
    assert train["perf/throughput"].tolist() == [950.5, 990.0]  # kept: not rollout throughput
    assert "perf/rollout_tokens_per_s" not in train.columns
    assert train["custom/thing"].tolist() == [7, 8] and "_runtime" in train.columns  # unknown keys kept as is
    assert evals.index.tolist() == [0, 2] and evals["eval/avg@8"].tolist() == [0.3, 0.35]
    assert evals["val-aux/aime_2024/reward/mean@8"].tolist() == [-0.4, -0.3]
    assert frames.recipe is None and frames.avg_key == "eval/avg@8"


def test_rollout_throughput_derived_only_when_batch_given(tmp_path):
    path = tmp_path / "history.csv"
    path.write_text(HISTORY)
    train = read_wandb_csv(path, trajectories_per_step=256, accuracy_from_score=False).train
    assert train["perf/rollout_tokens_per_s"].tolist() == pytest.approx([100 * 256 / 20.0, 120 * 256 / 24.0])
    assert "reward/accuracy" not in train.columns


def _panel(path, run, metric, rows):
    header = f'Step,"{run} - {metric}","{run} - {metric}__MIN","{run} - {metric}__MAX"'
    path.write_text(header + "\n" + "\n".join(f"{s},{v},{v - 0.01},{v + 0.01}" for s, v in rows) + "\n")
    return path


def test_wandb_panel_exports_merge_on_step(tmp_path):
    run = "dsv4 - 24gpu"  # a run name with " - " in it: the metric is what follows the last separator
    kl = _panel(tmp_path / "kl.csv", run, "rollout_corr/kl", [(1, 0.40), (2, 0.45), (3, 0.47)])
    ess = _panel(tmp_path / "ess.csv", run, "rollout_corr/rollout_is_eff_sample_size", [(2, 0.80), (3, 0.79)])
    frames = read_wandb_csv([kl, ess])
    assert frames.train.index.tolist() == [1, 2, 3]
    assert frames.train["rollout_corr/kl"].tolist() == [0.40, 0.45, 0.47]  # the plain column, not __MIN/__MAX
    assert frames.train["rollout_corr/rollout_is_eff_sample_size"].tolist()[1:] == [0.80, 0.79]
    assert sorted(frames.train.columns) == ["rollout_corr/kl", "rollout_corr/rollout_is_eff_sample_size"]


def test_panel_with_several_runs_needs_a_choice(tmp_path):
    path = tmp_path / "two.csv"
    path.write_text('Step,"a - critic/score/mean","a - critic/score/mean__MIN","a - critic/score/mean__MAX",'
                    '"b - critic/score/mean","b - critic/score/mean__MIN","b - critic/score/mean__MAX"\n'
                    "1,0.0,0.0,0.0,0.5,0.5,0.5\n")
    with pytest.raises(MetricsError, match=r"two.csv: export holds several runs \(a, b\); pass run="):
        read_wandb_csv(path)
    assert read_wandb_csv(path, run="b").train["critic/score/mean"].tolist() == [0.5]
    with pytest.raises(MetricsError, match="no run 'c'"):
        read_wandb_csv(path, run="c")


def test_verl_jsonl_nested_and_flat(tmp_path):
    rows = [
        {"step": 0, "data": {"val-core/aime/acc/mean@8": 0.3, "timing_s/testing": 40.0}},
        {"step": 1, "data": {"training/global_step": 1, "critic/score/mean": -0.2, "timing_s/old_log_prob": 3.0,
                             "timing_s/update_weights": 1.5, "actor/pg_loss": 0.01, "rollout_corr/k3_kl": 0.3}},
        {"step": 2, "critic/score/mean": 0.0, "actor/pg_loss": 0.02, "timing_s/step": 60.0},  # a flat row
    ]
    path = tmp_path / "verl.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    frames = read_verl_jsonl(path)
    assert frames.train.index.tolist() == [1, 2]
    assert frames.train["actor/loss"].tolist() == [0.01, 0.02]
    assert frames.train.loc[1, "timing_s/old_logprob"] == 3.0 and frames.train.loc[1, "timing_s/sync"] == 1.5
    assert frames.train["reward/accuracy"].tolist() == pytest.approx([0.4, 0.5])
    assert frames.train.loc[1, "rollout_corr/k3_kl"] == 0.3
    assert frames.eval.loc[0, "eval/avg@8"] == 0.3 and frames.eval.loc[0, "timing_s/eval"] == 40.0


def test_eval_data_source_must_be_unambiguous(tmp_path):
    path = tmp_path / "two_sources.jsonl"
    path.write_text(json.dumps({"step": 1, "critic/score/mean": 0.0, "val-core/aime/acc/mean@8": 0.3,
                                "val-core/math500/acc/mean@4": 0.7}) + "\n")
    with pytest.raises(MetricsError, match=r"several eval data sources \(aime, math500\)"):
        read_verl_jsonl(path)
    frames = read_verl_jsonl(path, data_source="math500")
    assert frames.eval.loc[1, "eval/avg@4"] == 0.7 and frames.eval.loc[1, "val-core/aime/acc/mean@8"] == 0.3
    with pytest.raises(MetricsError, match="no column val-core/gsm8k"):
        read_verl_jsonl(path, data_source="gsm8k")


def test_import_errors_name_the_file(tmp_path):
    with pytest.raises(MetricsError, match="missing.csv: W&B export not found"):
        read_wandb_csv(tmp_path / "missing.csv")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(MetricsError, match="empty.csv: not a readable CSV"):
        read_wandb_csv(tmp_path / "empty.csv")
    (tmp_path / "nostep.csv").write_text("critic/score/mean\n0.1\n")
    with pytest.raises(MetricsError, match="nostep.csv: no step column"):
        read_wandb_csv(tmp_path / "nostep.csv")
    (tmp_path / "bad.jsonl").write_text('{"step": 1}\n{oops\n{"step": 2}\n')
    with pytest.raises(MetricsError, match="bad.jsonl:2: corrupt line"):
        read_verl_jsonl(tmp_path / "bad.jsonl")


def test_imported_frames_feed_the_comparison(tmp_path):
    path = tmp_path / "history.csv"
    path.write_text(HISTORY)
    table = compare_to_amd(read_wandb_csv(path)).set_index("metric")
    end = table.loc["held-out avg@k, end"]
    assert (end["run"], end["step"], end["key"]) == (0.35, 2, "eval/avg@8")
    assert end["inside"] is None and end["band"] == "no band"  # no per-problem counts: no interval to test against
    kl = table.loc["train-rollout KL, k1 estimator, end"]
    assert (kl["run"], kl["step"]) == (0.47, 2) and "run ends at step 2" in kl["note"]
    throughput = table.loc["rollout tokens/s, mean"]
    assert math.isnan(throughput["run"]) and throughput["note"] == "no `perf/rollout_tokens_per_s` in this source"


def test_panel_exports_with_min_max_and_a_custom_x_axis():
    """W&B panels of a LumenRL run: x axis train/global_step, each metric with __MIN/__MAX companions (the spread of
    points W&B merged when downsampling); the plain column is kept, panels merge on the step."""
    frames = read_wandb_csv(sorted((DATA / "wandb").glob("panel_*.csv")))
    assert frames.train.index.tolist() == [1, 2, 3, 4, 6, 8, 10]
    assert frames.train["reward/accuracy"].tolist() == [0.41, 0.42, 0.43, 0.44, 0.465, 0.485, 0.505]
    assert frames.train.loc[[1, 2], "rollout_corr/kl"].tolist() == [0.0021, -0.0007]
    assert math.isnan(frames.train.loc[3, "rollout_corr/kl"])  # step 3 is only in the reward panel
    assert frames.train.loc[4, "rollout_corr/kl"] == 0.0007 and \
        frames.train.loc[10, "rollout_corr/rollout_is_eff_sample_size"] == 0.85
    assert sorted(frames.train.columns) == \
        ["reward/accuracy", "rollout_corr/kl", "rollout_corr/rollout_is_eff_sample_size"]
    assert frames.label == "wandb" and frames.kind == "wandb"


def test_a_bad_wandb_export_is_named_by_file_and_line():
    with pytest.raises(MetricsError, match=r"bad_fields\.csv:4: 5 fields where the header has 4"):
        read_wandb_csv(DATA / "wandb" / "bad_fields.csv")
    with pytest.raises(MetricsError, match=r"bad_value\.csv:4: column 'rollout_corr/kl' holds 'O\.0021', not a number"):
        read_wandb_csv(DATA / "wandb" / "bad_value.csv")


def test_verl_file_logger_jsonl():
    frames = read_verl_jsonl(DATA / "verl" / "metrics.jsonl")
    assert frames.train.index.tolist() == [1, 2, 3, 4, 5, 6] and frames.eval.index.tolist() == [0, 3, 6]
    assert frames.eval["eval/avg@8"].tolist() == [0.275, 0.3, 0.325]
    assert frames.eval["timing_s/eval"].tolist() == [410.0, 400.0, 400.0]
    assert frames.train["reward/accuracy"].tolist() == pytest.approx([0.42, 0.44, 0.46, 0.48, 0.5, 0.52])
    assert frames.origin("reward/accuracy") == "(1 + critic/score/mean) / 2"
    assert frames.step_time_includes_eval and "perf/rollout_tokens_per_s" not in frames.train.columns
    # verl times validation inside timing_s/step: only the step-0 evaluation (before any step) is added
    t = summary.time_to_train(frames, steps=75)
    assert t["eval_s_total"] == 1210.0
    assert t["hours_logged"] == pytest.approx((frames.train["timing_s/step"].sum() + 410.0) / 3600)


def test_a_bad_or_torn_jsonl_is_named_by_file_and_line(tmp_path):
    with pytest.raises(MetricsError, match=r"bad_line\.jsonl:4: corrupt line"):
        read_verl_jsonl(DATA / "verl" / "bad_line.jsonl")
    torn = tmp_path / "metrics.jsonl"
    text = (DATA / "verl" / "metrics.jsonl").read_text()
    torn.write_text(text[:-40])  # a writer killed mid-line
    with pytest.warns(TornLineWarning, match=r"metrics\.jsonl:7: torn last line dropped"):
        frames = read_verl_jsonl(torn)
    assert frames.train.index.tolist() == [1, 2, 3, 4, 5]


def test_mirror_columns_collapse_and_a_lone_train_key_is_renamed():
    table = pd.DataFrame({"train/global_step": [1, 2], "loss": [0.5, 0.4], "train/loss": [0.5, 0.4],
                          "core/loss": [0.5, 0.4], "core/odd": [7.0, 8.0], "train/only_here": [1.0, 2.0],
                          "num_turns/mean": [1.0, 1.0], "train/num_gen_batches": [1.0, 1.0]})
    out = collapse_mirrors(table)
    assert sorted(out.columns) == ["core/odd", "loss", "num_gen_batches", "num_turns/mean", "only_here",
                                   "train/global_step"]  # equal values alone never drop a train/ key
    assert out["only_here"].tolist() == [1.0, 2.0]  # older LumenRL logged only train/ keys to W&B


def test_the_first_synonym_present_wins_and_the_others_keep_their_names():
    table = pd.DataFrame({"step": [1, 2], "timing_s/gen": [10.0, 11.0], "timing/gen_s": [9.0, 9.5],
                          "reward/accuracy": [0.5, 0.6]})
    frames = frames_from_table(table, Path("x.jsonl"))
    assert frames.train["timing_s/rollout"].tolist() == [10.0, 11.0] and \
        frames.origin("timing_s/rollout") == "timing_s/gen"
    assert frames.train["timing/gen_s"].tolist() == [9.0, 9.5]
