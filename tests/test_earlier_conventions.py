"""A run directory written before AMD's conventions were recipe fields: read as what it ran, and not resumed under
other conventions by accident (repro.recipes.earlier)."""

from __future__ import annotations

import pytest
import yaml

from repro.analysis import load_run
from repro.analysis.caveats import rollout_logprobs
from repro.errors import ReproError
from repro.recipes import dump_recipe, load_recipe
from repro.recipes.earlier import EARLIER_CONVENTIONS
from repro.run.run_dir import check_conventions_kept


def _earlier_run_dir(tmp_path):
    """A tiny run dir as repro wrote it before the fields: its resolved recipe lacks every convention key."""
    dump_recipe(load_recipe("tiny-cpu"), tmp_path / "recipe.yaml")
    data = yaml.safe_load((tmp_path / "recipe.yaml").read_text())
    for dotted in EARLIER_CONVENTIONS:
        *sections, key = dotted.split(".")
        node = data
        for section in sections:
            node = node[section]
        del node[key]
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "reward/accuracy": 0.5}\n')
    return tmp_path


def test_an_earlier_run_reads_as_the_conventions_it_ran(tmp_path):
    frames = load_run(_earlier_run_dir(tmp_path))
    r = frames.recipe
    assert (r.rollout.logprobs_mode, r.algorithm.clip_ratio_c, r.algorithm.adv_std) == ("processed", 3.0, "sample")
    assert (r.reward.boxed_fallback, r.eval.after_first_update, r.data.train.dedupe) == (False, False, True)
    assert rollout_logprobs(frames) == "processed"  # so the comparison marks its KL/ESS against AMD's raw ones
    assert any("predates the recipe fields" in note and "verl's" in note for note in frames.notes)


def test_a_run_written_since_reads_unchanged(tmp_path):
    dump_recipe(load_recipe("tiny-cpu"), tmp_path / "recipe.yaml")
    (tmp_path / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "reward/accuracy": 0.5}\n')
    frames = load_run(tmp_path)
    assert frames.recipe.rollout.logprobs_mode == "raw" and not any("predates" in n for n in frames.notes)


def test_resuming_an_earlier_run_under_amds_conventions_is_refused_naming_the_sets(tmp_path):
    run_dir = _earlier_run_dir(tmp_path)
    with pytest.raises(ReproError, match=r"--set rollout.logprobs_mode=processed .*--set algorithm.clip_ratio_c=3.0"):
        check_conventions_kept(load_recipe("tiny-cpu"), run_dir / "recipe.yaml")
    kept = [f"{k}={v}" for k, v in EARLIER_CONVENTIONS.items()]
    check_conventions_kept(load_recipe("tiny-cpu", kept), run_dir / "recipe.yaml")  # as it ran: accepted
