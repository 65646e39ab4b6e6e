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
    assert log.origin("timing_s/update") == "timing_s/update_actor" and log.origin("timing_s/sync") == "timing_s/update_weights"
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
    assert len(shared) == len(log.train.columns) and not set(export.train.columns) - set(shared) - {"_runtime", "_timestamp"}
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
