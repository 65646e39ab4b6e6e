"""LumenRL's console log into our frames: hand-written logs shaped like what its LoggingCallback writes (logging and
Ray prefixes, progress bars, other messages that mention a step, a crash and a resume), the same run's W&B export
read to the same numbers, an old 0-based log, and bad files whose errors name the file and line.

The fixtures live in tests/data/lumenrl and tests/data/wandb (see tests/data/README.md for how they are shaped)."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from repro.analysis import MetricsError, read_lumenrl_log, read_wandb_csv
from repro.analysis.frame import TornLineWarning
from repro.metric_keys import POSITION_KEYS, position_buckets, position_key

DATA = Path(__file__).parent / "data"
LOG = DATA / "lumenrl" / "train.log"


@pytest.fixture(scope="module")
def log():
    return read_lumenrl_log(LOG)


def test_metrics_lines_are_read_and_everything_else_skipped(log):
    train = log.train
    assert train.index.tolist() == list(range(1, 13))
    # step 3's line follows a progress bar's carriage return and Ray's "(TaskRunner pid=...)" prefix
    assert train.loc[3, "reward/accuracy"] == 0.43 and train.loc[3, "perf/rollout_tokens_per_s"] == 303.0
    # messages that mention a step are not metrics: ENT_DIAG, "[step=N] r3_verify", "[eval] step=5", "Saving checkpoint"
    assert not {"resp_ent", "abs_diff", "acc", "score_mean", "tokens"} & set(train.columns)
    assert math.isnan(train.loc[1, "actor/ppo_kl"]) and train.loc[2, "actor/ppo_kl"] == 1e-05  # "nan", "1e-05"
    assert train.loc[4, "timing_s/step"] == 286.5  # 270 + 4 + 12.5 + 1.2e-05, as %.6g wrote it


def test_a_resumed_run_keeps_the_rows_it_continued_from(log):
    # steps 6 and 7 were logged before the crash (0.36, 0.37) and again after the resume (0.46, 0.47)
    assert log.train.loc[5:8, "reward/accuracy"].tolist() == [0.45, 0.46, 0.47, 0.48]


def test_lumenrl_keys_map_onto_ours(log):
    train = log.train
    assert train["perf/rollout_tokens_per_s"].tolist() == [300.0 + n for n in range(1, 13)]  # throughput/gen_tok_per_s
    assert log.origin("perf/rollout_tokens_per_s") == "throughput/gen_tok_per_s"
    assert log.origin("timing_s/rollout") == "timing_s/gen" and train.loc[2, "timing_s/rollout"] == 202.0
    assert log.origin("timing_s/update") == "timing_s/update_actor" and \
        log.origin("timing_s/sync") == "timing_s/update_weights"
    # LumenRL's own names stay beside ours when ours came from the verl-style key
    assert train.loc[2, "timing/gen_s"] == 202.0 and train.loc[2, "seq/mean_response_len"] == 1020.0
    # LumenRL's k3 is another estimator: kept under its own name, never poured into rollout_corr/k3_kl
    assert train.loc[2, "mismatch/k3_kl"] == 0.0013 and train.loc[2, "rollout_corr/k3_kl"] == 0.0011
    assert train.loc[2, "rollout_corr/kl"] == -0.0007  # k1 below zero survives
    assert log.step_time_includes_eval  # timing_s/step is taken after validation


def test_validation_merged_into_the_step_line_becomes_evaluation_rows(log):
    evals = log.eval
    assert evals.index.tolist() == [5, 10] and log.avg_key == "eval/avg@8"
    assert evals["eval/avg@8"].tolist() == [0.3, 0.3125]
    assert log.origin("eval/avg@8") == "val-core/math_dapo/acc/mean@8"
    assert evals["timing_s/eval"].tolist() == [95.5, 95.5]  # timing_s/testing, kept on evaluation rows only
    assert "timing_s/eval" not in log.train.columns and not log.has_problem_counts


def test_the_wandb_export_of_the_same_run_reads_to_the_same_frames(log):
    """LumenRL's W&B payload repeats keys under train/ and core/ and steps by train/global_step; after collapsing
    the mirrors the export and the console log (rounded to %.6g) hold the same numbers."""
    export = read_wandb_csv(DATA / "wandb" / "lumenrl_history.csv")
    assert export.train.index.tolist() == list(range(1, 11))
    assert not [c for c in export.train.columns if c.startswith(("train/", "core/"))]
    assert "val/generations" not in export.eval.columns and "val/generations" in export.notes[0]
    shared = sorted((set(export.train.columns) & set(log.train.columns)))
    assert len(shared) == len(log.train.columns) and \
        not set(export.train.columns) - set(shared) - {"_runtime", "_timestamp"}
    np.testing.assert_allclose(export.train[shared].to_numpy(float), log.train.loc[1:10, shared].to_numpy(float),
                               rtol=5e-6, equal_nan=True)
    pd.testing.assert_frame_equal(export.eval[log.eval.columns], log.eval, check_exact=False, rtol=5e-6)
    assert export.origins == log.origins


def test_an_old_zero_based_log_is_shifted_to_update_counts():
    old = read_lumenrl_log(DATA / "lumenrl" / "old_zero_based.log")
    assert old.train.index.tolist() == [1, 2, 3, 4, 5, 6]
    assert old.train["reward/accuracy"].tolist() == [0.25, 0.28125, 0.3125, 0.3125, 0.34375, 0.375]
    assert old.eval.index.tolist() == [5] and old.eval.loc[5, "val/score_mean"] == -0.4  # "eval step=4": 0-based
    assert old.origin("timing_s/step") == "timing/step_s" and not old.step_time_includes_eval
    assert old.origin("actor/loss") == "loss" and old.origin("response_length/mean") == "seq/mean_response_len"
    assert any("counts training steps from 0" in n for n in old.notes)
    assert any("'eval step=N' lines" in n for n in old.notes)


def test_a_corrupt_metrics_line_is_named_by_file_and_line():
    with pytest.raises(MetricsError, match=r"bad_line\.log:16: LumenRL metrics line does not parse: "
                                           r"actor/grad_norm='0\.2\(MegatronActorWorker' is not a number"):
        read_lumenrl_log(DATA / "lumenrl" / "bad_line.log")


def test_a_torn_last_line_warns_with_file_and_line_and_is_dropped(tmp_path):
    lines = LOG.read_text().split("\n")
    last = next(i for i in range(len(lines) - 1, -1, -1) if "callbacks: step=12" in lines[i])
    torn = tmp_path / "train.log"
    torn.write_text("\n".join(lines[:last] + [lines[last][:lines[last].index("reward/accuracy") + 9]]))
    with pytest.warns(TornLineWarning, match=rf"train\.log:{last + 1}: torn last line dropped"):
        frames = read_lumenrl_log(torn)
    assert frames.train.index.tolist() == list(range(1, 12))


def test_a_log_without_metrics_lines_is_refused(tmp_path):
    path = tmp_path / "noise.log"
    path.write_text("2026-08-17 09:00:00 [INFO] lumenrl.main: LumenRL starting\nENT_DIAG step=0 resp_ent=0.6\n")
    with pytest.raises(MetricsError, match=r"noise\.log: no LumenRL metrics lines"):
        read_lumenrl_log(path)


# -- one run's console log and its W&B export (tests/data/lumenrl/make_eval_positions.py): LumenRL 2232f55 on its
#    DeepSeek-V4 path, an EvalCallback evaluation after the first update, validation every 5 steps, pos_* keys
BUCKETS = position_buckets()
EVAL_LOG, EVAL_CSV = DATA / "lumenrl" / "eval_positions.log", DATA / "wandb" / "eval_positions_history.csv"


def test_console_log_and_wandb_export_give_the_same_evaluations_and_position_buckets():
    console, export = read_lumenrl_log(EVAL_LOG), read_wandb_csv(EVAL_CSV)
    # 'eval step=1' is LumenRL's step + 1 (callbacks.py:277), the W&B step of the row its values land in (:387-389)
    assert console.eval.index.tolist() == export.eval.index.tolist() == [1, 5, 10]
    assert console.eval["eval/avg@8"].tolist() == export.eval["eval/avg@8"].tolist() == [0.319, 0.395, 0.49]
    assert console.origin("eval/avg@8") == export.origin("eval/avg@8") == "val-core/math_dapo/acc/mean@8"
    shared = [c for c in console.eval.columns if c != "timing_s/eval"]
    pd.testing.assert_frame_equal(console.eval[shared], export.eval[shared], check_exact=True)
    assert not any("0-based" in n for n in console.notes)  # nothing was shifted
    positions = [c for c in console.train.columns if c.startswith("rollout_corr/pos_")]
    assert sorted(positions) == sorted(POSITION_KEYS)  # every bucket and statistic, under LumenRL's own names
    assert sorted(c for c in export.train.columns if c.startswith("rollout_corr/pos_")) == sorted(positions)
    pd.testing.assert_frame_equal(console.train[positions], export.train[positions], check_exact=True)
    last = position_key(2048, 4096, "kl")
    assert math.isnan(console.train.loc[2, last]) and math.isnan(export.train.loc[2, last])  # no tokens: not logged
    assert console.train.loc[1, position_key(0, 128, "kl")] == -0.002757  # k1 below zero survives
    assert console.train.loc[3, position_key(1024, 2048, "tokens")] == 42270.0


def test_an_eval_line_at_step_0_under_one_based_step_lines_is_from_before_fcbe86f(tmp_path):
    """Between 815a0ef and fcbe86f the step lines were 1-based and EvalCallback still logged the 0-based step: its
    first evaluation, after the first update, reads 'eval step=0'. Such a log is told apart and its evals shifted."""
    lines = EVAL_LOG.read_text().split("\n")
    old = tmp_path / "window.log"
    old.write_text("\n".join(line.replace("callbacks: eval step=1 ", "callbacks: eval step=0 ") for line in lines))
    frames = read_lumenrl_log(old)
    assert frames.eval.index.tolist() == [1, 5, 10] and frames.train.index.tolist() == list(range(1, 11))
    assert any("'eval step=N' lines carry a 0-based N" in n for n in frames.notes)


def test_the_synthetic_75_step_sample_reads_as_a_lumenrl_run_with_every_position_bucket():
    """tests/data/lumenrl/synthetic_positions_75.log: made-up numbers in LumenRL's shape, for drawing KL by position."""
    path = DATA / "lumenrl" / "synthetic_positions_75.log"
    assert path.read_text().startswith("# SYNTHETIC: made up by tests/data/lumenrl/make_eval_positions.py")
    frames = read_lumenrl_log(path)
    assert frames.train.index.tolist() == list(range(1, 76)) and frames.eval.index.tolist() == [1, *range(5, 76, 5)]
    assert frames.train[list(POSITION_KEYS)].notna().all().all()
    # the run's k1 is the token-weighted mean of the buckets' k1 (every response ends before 4,096 tokens)
    kl = [frames.train[position_key(s, e, "kl")] * frames.train[position_key(s, e, "tokens")] for s, e in BUCKETS]
    tokens = sum(frames.train[position_key(s, e, "tokens")] for s, e in BUCKETS)
    np.testing.assert_allclose(sum(kl) / tokens, frames.train["rollout_corr/kl"], rtol=1e-5)


def test_a_panel_export_of_a_position_bucket_reads_under_lumenrls_key(tmp_path):
    """A W&B chart export names the column '<run> - <key>'; LumenRL's train/ mirror of the key reads as the key."""
    key = position_key(512, 1024, "kl")
    panel = tmp_path / "panel.csv"
    panel.write_text(f"train/global_step,dsv4 - train/{key},dsv4 - train/{key}__MIN,dsv4 - train/{key}__MAX\n"
                     "1,0.0114796,0.0114796,0.0114796\n2,0.0123,0.0123,0.0123\n")
    frames = read_wandb_csv(panel)
    assert frames.train[key].tolist() == [0.0114796, 0.0123] and frames.train.index.tolist() == [1, 2]
