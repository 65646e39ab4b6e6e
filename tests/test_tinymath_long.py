"""tiny-math-long: the worked answers, the fixed splits, its recipe datasets and its warm start's determinism."""

import os

import pandas as pd
import pytest
import torch

from repro.data.recipe_datasets import load_dataset, prompt_ids
from repro.data.tinymath import TINY_ALPHABET
from repro.data.tinymath_long import (
    RunningTotal, all_long_problems, long_held_out_problems, long_train_problems, write_tiny_math_long,
)
from repro.model.tokenizer import build_tiny_tokenizer
from repro.model.warmstart import (
    IGNORE, WarmStartConfig, deterministic_setup, max_response_tokens, sft_batch, train_steps,
)
from repro.recipes.schema import DatasetConfig
from repro.reward import score_response


def test_worked_answer_counts_down_and_ends_on_the_answer_line():
    p = RunningTotal(95, 9, 3)
    assert p.problem == "95+9 03" and p.answer == "122"
    assert p.response == "02:95+9=104\n01:104+9=113\n00:113+9=122\nAnswer: 122"
    assert score_response(p.response, p.answer).acc == 1.0  # the DAPO rule reads the last Answer: line
    assert score_response(p.working + "Answer: 121", p.answer).acc == 0.0
    assert set(p.problem + "=" + p.response) <= set(TINY_ALPHABET)  # same tokenizer as tiny-math


def test_fixed_seed_gives_these_problems():
    assert long_held_out_problems(12)[:3] == [RunningTotal(73, 5, 12), RunningTotal(19, 4, 12), RunningTotal(83, 5, 12)]
    assert long_train_problems(12, seed=0)[:3] == [RunningTotal(79, 5, 12), RunningTotal(99, 7, 12),
                                                  RunningTotal(18, 7, 12)]
    assert long_train_problems(12, seed=1)[:3] != long_train_problems(12, seed=0)[:3]


def test_splits_are_disjoint_and_cover_the_task():
    held, train = long_held_out_problems(12), long_train_problems(12)
    assert len(all_long_problems(12)) == 90 * 9 and len(held) == 30 and len(train) == 780
    assert not set(held) & set(train)
    assert long_held_out_problems(12) == held  # fixed, whatever the run seed
    with pytest.raises(ValueError, match=r"terms must be in \[1, 99\]"):
        all_long_problems(100)


def test_terms_is_the_length_knob():
    tokenizer = build_tiny_tokenizer()
    lengths = {t: max(len(tokenizer(p.response).input_ids) for p in all_long_problems(t)) for t in (1, 12, 20)}
    # BOS + one token per character: "00:99+9=108\nAnswer: 108" is 23; each further term adds its 13-character line
    assert lengths == {1: 24, 12: 24 + 11 * 13, 20: 24 + 19 * 13}
    assert max_response_tokens(12) == 167 - 1 + 1 + 2  # without BOS, with EOS, +2 spare
    assert max_response_tokens(0) == 12  # tiny-math's own
    assert WarmStartConfig(terms=12).max_new_tokens == 169


def test_recipe_datasets_write_and_load_the_long_split(tmp_path):
    config = DatasetConfig(kind="tiny_math_long_train", template="tiny", terms=5)
    problems = load_dataset(config, tmp_path, seed=3)
    assert [p.name for p in tmp_path.iterdir()] == ["long_train.parquet"]
    expected = long_train_problems(5, seed=3)
    assert [p.ground_truth for p in problems] == [p.answer for p in expected]
    tokenizer = build_tiny_tokenizer()
    assert tokenizer.decode(prompt_ids(tokenizer, problems[0], "tiny")) == f"<bos>{expected[0].problem}="
    held = load_dataset(DatasetConfig(kind="tiny_math_long_held_out", template="tiny", terms=5), tmp_path)
    assert len(held) == 30
    frame = pd.read_parquet(write_tiny_math_long(tmp_path, 5, splits=("held_out",))["held_out"])
    assert frame.loc[0, "extra_info"]["terms"] == 5 and frame.loc[0, "data_source"] == "tiny-math-long"


def test_sft_batch_trains_on_the_whole_worked_response():
    tokenizer = build_tiny_tokenizer()
    p = RunningTotal(10, 1, 2)
    input_ids, labels = sft_batch([p], tokenizer)
    assert tokenizer.decode(input_ids[0]) == "<bos>10+1 02=01:10+1=11\n00:11+1=12\nAnswer: 12<eos>"
    prompt = len("<bos>10+1 02=") - len("<bos>") + 1
    assert (labels[0, :prompt] == IGNORE).all()
    assert tokenizer.decode(labels[0, prompt:]) == p.response + "<eos>"


def test_long_warm_start_steps_are_deterministic():
    """The property `repro warmstart --terms N` regenerates its asset by: same seed and threads, same weights."""
    before = torch.get_num_threads()
    config = WarmStartConfig(batch_size=4, terms=3)
    tokenizer = build_tiny_tokenizer()
    runs = []
    try:
        for _ in range(2):
            deterministic_setup(config.threads)
            from repro.model.tiny import build_tiny_model

            model = build_tiny_model(config.seed)
            state = train_steps(model, tokenizer, config, 3)
            runs.append((model.state_dict(), state["losses"]))
    finally:
        torch.use_deterministic_algorithms(False)
        torch.set_num_threads(before)
    (weights_a, losses_a), (weights_b, losses_b) = runs
    assert losses_a == losses_b and len(losses_a) == 3
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)


def test_shipped_long_warm_start_matches_its_hashes_and_says_how_it_was_made():
    import json

    from repro import PACKAGE_DIR
    from repro.model.assets import LONG_ASSET_NAME, LONG_REGENERATE_COMMAND, verify_hashes

    folder = PACKAGE_DIR / "assets" / LONG_ASSET_NAME
    verify_hashes(folder)
    provenance = json.loads((folder / "warmstart.json").read_text())
    assert provenance["command"] == LONG_REGENERATE_COMMAND and provenance["config"]["terms"] == 12
    accuracy = provenance["accuracy_T0.8"]
    assert 0.2 <= accuracy["train"]["avg@8"] <= 0.6 and accuracy["held_out"]["problems"] == 30
    assert json.loads((folder / "generation_config.json").read_text())["max_new_tokens"] == 169


@pytest.mark.skipif(os.environ.get("REPRO_REGENERATE_ASSETS") != "1",
                    reason="regenerating the long warm start takes ~15-25 min on 2 cores: REPRO_REGENERATE_ASSETS=1")
def test_long_warm_start_regenerates_bit_for_bit(tmp_path):
    """`repro warmstart` with the recorded command gives the shipped weights byte for byte (same thread count; another
    CPU may round differently). warmstart.json records wall times, so only the other files are compared."""
    import shlex
    import subprocess
    import sys

    from repro import PACKAGE_DIR
    from repro.model.assets import LONG_ASSET_NAME, LONG_REGENERATE_COMMAND, folder_hashes

    args = shlex.split(LONG_REGENERATE_COMMAND)[3:]  # after "python -m repro"
    out = tmp_path / LONG_ASSET_NAME
    args[args.index("--out") + 1] = str(out)
    subprocess.run([sys.executable, "-m", "repro", *args], check=True)
    shipped = folder_hashes(PACKAGE_DIR / "assets" / LONG_ASSET_NAME)
    regenerated = folder_hashes(out)
    shipped.pop("warmstart.json"), regenerated.pop("warmstart.json")
    assert regenerated == shipped
