"""The rollouts on disk (repro.run.rollouts_file) and `repro rollouts`: the records of a hand-built step, exact;
the file read back equal; a damaged file refused naming the file and line; the command's selection and errors."""

from __future__ import annotations

import gzip
import json
import math

import pytest
import torch

from repro.cli import main
from repro.data.records import MathProblem
from repro.errors import ReproError
from repro.model.warmstart_io import ensure_warm_checkpoint
from repro.model.hf_folder import load_tiny_tokenizer
from repro.reward import RewardResult
from repro.rollout.types import FinishReason, RolloutResult, Trajectory
from repro.run.rollouts_file import (FIELDS, StepTrajectories, read_rollouts, rollout_records, rollout_steps,
                                     rollouts_path, write_rollouts)
from repro.train.batch import build_batch

PROMPTS = ["12+34=", "70+5="]
RESPONSES = ["Answer: 46", "Answer: 47", "Answer: 75", "Answer: 7"]
# log π_old - log π_rollout per response token, by trajectory: trajectory 1 has the largest gap (log 3 at its
# 9th token, the '4' of '47'; 3 > the cap 2), trajectory 3 is cut at the length limit (no EOS)
GAPS = {0: {}, 1: {8: math.log(3.0), 2: -0.5}, 2: {0: 0.25}, 3: {}}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tiny_tokenizer(ensure_warm_checkpoint())


def make_step(tokenizer) -> StepTrajectories:
    trajectories = []
    for i, text in enumerate(RESPONSES):
        prompt = tokenizer.encode(PROMPTS[i // 2])
        response = tokenizer.encode(text, add_special_tokens=False) + ([] if i == 3 else [tokenizer.eos_token_id])
        logprobs = -0.1 * torch.arange(1, len(response) + 1, dtype=torch.float32)
        trajectories.append(Trajectory(i // 2, i % 2, prompt, response, logprobs,
                                       FinishReason.LENGTH if i == 3 else FinishReason.EOS, weight_version=4))
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0])
    batch = build_batch(trajectories, advantages, tokenizer.pad_token_id, with_routing=False)
    old = batch.rollout_logprobs.clone()
    for row, gaps in GAPS.items():
        start = len(trajectories[row].prompt_ids) - 1  # the response's first scored position
        for position, gap in gaps.items():
            old[row, start + position] += gap
    batch.old_logprobs = old
    rewards = [RewardResult(1.0, True, "46"), RewardResult(-1.0, False, "47"), RewardResult(1.0, True, "75"),
               RewardResult(-1.0, False, "7")]
    problems = [MathProblem("a", "12+34", "46", "tiny"), MathProblem("b", "70+5", "75", "tiny")]
    return StepTrajectories(problems, RolloutResult(trajectories, 40, 0.1), rewards, batch)


def test_the_records_of_a_hand_built_step(tokenizer):
    records = rollout_records(make_step(tokenizer), tokenizer, cap=2.0)
    assert [list(r) for r in records] == [list(FIELDS)] * 4
    first, worst, cut = records[0], records[1], records[3]
    assert (first["prompt"], first["response"], first["answer"]) == ("12+34=", "Answer: 46", "46")
    assert (first["group"], first["sample"], worst["group"], worst["sample"]) == (0, 0, 0, 1)
    assert (first["score"], first["acc"], first["advantage"], worst["advantage"]) == (1.0, True, 1.0, -1.0)
    assert (first["length"], first["finish"], cut["length"], cut["finish"]) == (11, "eos", 9, "length")
    rollout_sum = -0.1 * sum(range(1, 12))
    assert first["rollout_logprob_sum"] == pytest.approx(rollout_sum, abs=1e-5)
    assert first["trainer_logprob_sum"] == first["rollout_logprob_sum"] and first["k3_kl"] == 0.0
    assert worst["trainer_logprob_sum"] - worst["rollout_logprob_sum"] == pytest.approx(math.log(3.0) - 0.5, abs=1e-5)
    assert (worst["max_gap"], worst["max_gap_position"], worst["max_gap_token"]) == (
        pytest.approx(math.log(3.0), abs=1e-6), 8, "4")
    assert worst["above_cap_share"] == pytest.approx(1 / 11) and first["above_cap_share"] == 0.0
    k3 = (3.0 - math.log(3.0) - 1 + math.exp(-0.5) + 0.5 - 1) / 11
    assert worst["k3_kl"] == pytest.approx(k3, rel=1e-5)
    assert (records[2]["max_gap_position"], records[2]["max_gap_token"]) == (0, "A")
    assert (first["max_gap"], first["max_gap_position"]) == (0.0, 0)


def test_written_records_read_back_equal_and_the_file_is_replaced_whole(tokenizer, tmp_path):
    records = rollout_records(make_step(tokenizer), tokenizer, cap=2.0)
    path = write_rollouts(rollouts_path(tmp_path, 3), records)
    assert path == tmp_path / "rollouts" / "step_000003.jsonl.gz" and read_rollouts(path) == records
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left beside it
    write_rollouts(path, records[:2])  # a resumed run writes the step again
    assert read_rollouts(path) == records[:2] and rollout_steps(tmp_path) == [3]


def _gz(path, text: str):
    path.write_bytes(gzip.compress(text.encode()))
    return path


@pytest.mark.parametrize("damage, where, says", [
    ("cut", ":", "cut short or damaged"),
    ("not_gzip", ":1:", "cut short or damaged"),
    ("bad_json", ":2:", "not a JSON record"),
    ("missing", ":2:", "record lacks k3_kl"),
    ("repeated", ":3:", "record i=1 where 2 belongs"),
])
def test_a_damaged_file_is_named_with_its_line(tokenizer, tmp_path, damage, where, says):
    records = rollout_records(make_step(tokenizer), tokenizer, cap=2.0)
    lines = [json.dumps(r) for r in records]
    path = tmp_path / "step_000001.jsonl.gz"
    if damage == "cut":
        whole = gzip.compress(("\n".join(lines) + "\n").encode())
        path.write_bytes(whole[: len(whole) - 12])  # the end marker and some data lost
    elif damage == "not_gzip":
        path.write_text("\n".join(lines))
    elif damage == "bad_json":
        _gz(path, lines[0] + "\n" + lines[1][:40] + "\n" + lines[2] + "\n")
    elif damage == "missing":
        _gz(path, lines[0] + "\n" + json.dumps({k: v for k, v in records[1].items() if k != "k3_kl"}) + "\n")
    else:
        _gz(path, "\n".join([lines[0], lines[1], lines[1]]) + "\n")
    with pytest.raises(ReproError) as err:
        read_rollouts(path)
    assert str(err.value).startswith(str(path) + where) and says in str(err.value)


def test_the_command_prints_a_step_and_its_worst_trajectories(tokenizer, tmp_path, capsys):
    records = rollout_records(make_step(tokenizer), tokenizer, cap=2.0)
    write_rollouts(rollouts_path(tmp_path, 1), records)
    write_rollouts(rollouts_path(tmp_path, 2), records)
    assert main(["rollouts", str(tmp_path), "--step", "2", "--worst-kl", "2"]) == 0
    out = capsys.readouterr().out
    tokens = sum(r["length"] for r in records)
    k1 = sum(r["rollout_logprob_sum"] - r["trainer_logprob_sum"] for r in records) / tokens
    assert out.startswith(f"step 2: 4 trajectories in 2 groups, {tokens} response tokens, accuracy 50.0%, "
                          f"1 cut at the length limit; KL k1 {k1:.3e}")
    shown = [line.split()[0] for line in out.splitlines() if line.startswith("#")]
    assert shown == ["#1", "#2"]  # worst k3 first: the log-3 gap, then the 0.25 one
    assert "largest gap 1.0986 at token 8 '4', above cap 9.1%" in out and "response: 'Answer: 47'" in out
    assert main(["rollouts", str(tmp_path), "--step", "1", "--json"]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == records
    assert main(["rollouts", str(tmp_path), "--step", "7"]) == 1
    assert "no rollouts of step 7; it holds steps 1-2" in capsys.readouterr().err
