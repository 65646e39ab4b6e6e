"""LumenRL's console log streamed into metrics.jsonl: exact rows for a hand-built line, the same frames as the any-run
parser reads from the whole file (however the file arrives in pieces), torn and spliced lines; and LumenRL's
checkpoint folders read as the resume point LumenRL itself would pick."""

import math
import warnings
from pathlib import Path

import pandas as pd
import pytest

from repro.analysis.frame import frames_from_rows
from repro.analysis.lumenrl_log import read_lumenrl_log
from repro.errors import TornLineWarning
from repro.lumenrl.checkpoints import CheckpointWarning, latest_lumenrl_checkpoint
from repro.lumenrl.stream import LogFollower, MetricsStream, StreamWarning, rows_from_metrics
from repro.run.metrics_log import MetricsLog

DATA = Path(__file__).parent / "data" / "lumenrl"


def test_one_line_becomes_our_train_and_eval_rows():
    values = {"reward/mean": -0.2, "throughput/gen_tok_per_s": 301.0, "timing/gen_s": 201.0, "timing_s/step": 283.5,
              "timing/step_s": 271.0, "timing_s/testing": 31.0, "loss": 0.01, "val-core/math_dapo/acc/mean@8": 0.3,
              "actor/ppo_kl": math.nan, "rollout_corr/kl": math.inf}
    origins = {}
    train, evals = rows_from_metrics(5, values, Path("x.log"), origins=origins)
    assert train == {"kind": "train", "step": 5, "critic/score/mean": -0.2, "reward/accuracy": 0.4,
                     "perf/rollout_tokens_per_s": 301.0,
                     "timing_s/rollout": 201.0, "timing_s/step": 283.5, "timing/step_s": 271.0, "actor/loss": 0.01,
                     "actor/ppo_kl": None, "rollout_corr/kl": None}
    assert evals == {"kind": "eval", "step": 5, "timing_s/eval": 31.0, "eval/avg@8": 0.3}
    assert origins["eval/avg@8"] == "val-core/math_dapo/acc/mean@8" and "timing_s/step" not in origins
    assert origins["reward/accuracy"] == "(1 + reward/mean) / 2"
    # accuracy from the DAPO score when the line has none, as the importers derive it
    (row,) = rows_from_metrics(1, {"critic/score/mean": -0.18, "timing_s/testing": 1e-05}, Path("x.log"))
    assert row["reward/accuracy"] == pytest.approx(0.41) and "timing_s/eval" not in row
    # an EvalCallback line: only the evaluation row
    (row,) = rows_from_metrics(4, {"val-core/acc/mean@8": 0.25}, Path("x.log"), eval_line=True)
    assert row == {"kind": "eval", "step": 4, "eval/avg@8": 0.25}


def stream_in_pieces(source: Path, tmp_path: Path, cut: int = 997) -> tuple[MetricsStream, list[int]]:
    """Append ``source`` to a log ``cut`` bytes at a time (lines split mid-way), polling after each piece."""
    log, seen = tmp_path / "lumenrl.log", []
    log.write_bytes(b"")
    stream = MetricsStream(log, MetricsLog(tmp_path / "metrics.jsonl"), lambda step, row: seen.append(step))
    data = source.read_bytes()
    for start in range(0, len(data), cut):
        with open(log, "ab") as handle:
            handle.write(data[start:start + cut])
        stream.poll()
    stream.finish()
    return stream, seen


def assert_same_frames(streamed, parsed):
    columns = sorted(parsed.train.columns)
    assert sorted(streamed.train.columns) == columns
    pd.testing.assert_frame_equal(streamed.train[columns].astype(float), parsed.train[columns].astype(float))
    columns = sorted(parsed.eval.columns)
    assert sorted(streamed.eval.columns) == columns
    pd.testing.assert_frame_equal(streamed.eval[columns].astype(float), parsed.eval[columns].astype(float))


def test_streaming_in_pieces_gives_what_the_any_run_parser_reads(tmp_path):
    source = DATA / "train.log"  # a crash after step 7, a resume from step 5, validation at 5 and 10
    stream, seen = stream_in_pieces(source, tmp_path)
    assert seen == [1, 2, 3, 4, 5, 6, 7, 6, 7, 8, 9, 10, 11, 12]  # as logged: the resumed steps come again
    rows = MetricsLog(tmp_path / "metrics.jsonl").rows()
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [5, 10]
    streamed = frames_from_rows(rows, tmp_path / "metrics.jsonl")
    parsed = read_lumenrl_log(source)
    assert_same_frames(streamed, parsed)
    assert streamed.train.loc[6, "reward/accuracy"] == 0.46  # the row LumenRL logged after the resume
    assert stream.origins == parsed.origins


def test_a_zero_based_log_is_shifted_as_the_parser_shifts_it(tmp_path):
    source = DATA / "old_zero_based.log"
    _, seen = stream_in_pieces(source, tmp_path, cut=50)
    assert seen[0] == 1
    assert_same_frames(frames_from_rows(MetricsLog(tmp_path / "metrics.jsonl").rows(), tmp_path / "m"),
                       read_lumenrl_log(source))


def test_an_evalcallback_line_streams_at_the_step_it_carries(tmp_path):
    """'eval step=1' (LumenRL 2232f55: step + 1, callbacks.py:277) is the evaluation after the first update; a log
    from before fcbe86f, whose first eval line reads 'eval step=0', is shifted as the parser shifts it."""
    source = DATA / "eval_positions.log"
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    _, seen = stream_in_pieces(source, tmp_path / "a", cut=333)
    rows = MetricsLog(tmp_path / "a" / "metrics.jsonl").rows()
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [1, 5, 10] and seen == list(range(1, 11))
    assert_same_frames(frames_from_rows(rows, tmp_path / "m"), read_lumenrl_log(source))
    window = tmp_path / "window.log"
    window.write_text(source.read_text().replace("callbacks: eval step=1 ", "callbacks: eval step=0 "))
    stream_in_pieces(window, tmp_path / "b", cut=333)
    rows = MetricsLog(tmp_path / "b" / "metrics.jsonl").rows()
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [1, 5, 10]
    assert_same_frames(frames_from_rows(rows, tmp_path / "m"), read_lumenrl_log(window))


def test_a_spliced_line_is_skipped_with_its_line_number_and_a_torn_end_warns(tmp_path):
    with pytest.warns(StreamWarning, match=r"lumenrl.log:16: LumenRL metrics line does not parse"):
        stream, _ = stream_in_pieces(DATA / "bad_line.log", tmp_path)
    assert stream.skipped == [16]
    log = tmp_path / "torn.log"
    log.write_text("2026-08-17 09:00:10 [INFO] lumenrl.trainer.callbacks: step=1 loss=0.5\n"
                   "2026-08-17 09:00:17 [INFO] lumenrl.trainer.callbacks: step=2 loss=0.")
    stream = MetricsStream(log, MetricsLog(tmp_path / "torn.jsonl"), lambda s, r: None)
    assert stream.poll() == 1  # the line without its newline waits
    with pytest.warns(TornLineWarning, match=r"torn.log:2: torn last line dropped"):
        stream.finish()
    assert [r["step"] for r in MetricsLog(tmp_path / "torn.jsonl").rows()] == [1]


def test_the_follower_starts_at_an_offset_and_numbers_lines_in_the_whole_file(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("one\ntwo\n")
    follower = LogFollower(log, offset=log.stat().st_size)
    with open(log, "a") as handle:
        handle.write("three\nfour")
    assert follower.new_lines() == [(3, "three")] and follower.pending == b"four"


def _folder(root: Path, step: int, actor: bool = True) -> None:
    (root / f"global_step_{step}" / ("actor" if actor else "other")).mkdir(parents=True)


def test_the_resume_point_is_the_one_lumenrl_picks(tmp_path):
    assert latest_lumenrl_checkpoint(tmp_path / "none") is None
    for step in (25, 50):
        _folder(tmp_path, step)
    _folder(tmp_path, 75, actor=False)  # killed before its actor folder existed
    assert latest_lumenrl_checkpoint(tmp_path).step == 50  # no tracker: the newest folder with actor/
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("25")
    assert latest_lumenrl_checkpoint(tmp_path).path == tmp_path / "global_step_25"  # the tracker wins
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("75")
    assert latest_lumenrl_checkpoint(tmp_path).step == 50  # it names a folder without actor/: scan, as LumenRL
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("fifty")
    with pytest.warns(CheckpointWarning, match="latest_checkpointed_iteration.txt: expected a step number"):
        assert latest_lumenrl_checkpoint(tmp_path).step == 50
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (tmp_path / "latest_checkpointed_iteration.txt").write_text("25\n")
        assert latest_lumenrl_checkpoint(tmp_path).step == 25
