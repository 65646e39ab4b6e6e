"""W&B CSV exports (history and panel) and verl/LumenRL JSONL map into the frames of our own log."""

import json

import pytest

from repro.analysis import MetricsError, compare_to_amd
from repro.analysis.importers import read_verl_jsonl, read_wandb_csv

HISTORY = """\
,_step,_runtime,_timestamp,training/global_step,critic/score/mean,response_length/mean,timing_s/gen,timing_s/update_actor,perf/throughput,rollout_corr/kl,val-core/aime_2024/acc/mean@8,val-aux/aime_2024/reward/mean@8,custom/thing
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
    end = table.loc["held-out eval/avg@8, end (step 2)"]
    assert end["run"] == 0.35 and end["inside"] is None  # no per-problem counts: no interval to test against
    assert table.loc["train-rollout KL at step 2", "run"] == 0.47
