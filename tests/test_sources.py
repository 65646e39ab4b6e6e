"""Run sources: [LABEL=][KIND:]PATH parsed, the kind read from the content, several loaded with unique labels, the
notebook parameter resolved like notebook_setup's paths, and `repro compare` / `repro figures` on every kind."""

import argparse
import shutil
from pathlib import Path

import pytest

import repro
from repro.analysis import MetricsError, load_source, load_sources
from repro.analysis.sources import (SourceSpec, default_output_dir, detect_kind, parse_source,
                                    resolve_source_parameter)
from repro.analysis.synthetic import write_synthetic_run

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return write_synthetic_run(tmp_path_factory.mktemp("src") / "tiny", steps=30, seed=4)


def test_a_source_string_splits_into_label_kind_and_path():
    assert parse_source("runs/tiny-cpu") == SourceSpec("runs/tiny-cpu", None, None, "runs/tiny-cpu")
    assert parse_source("r3-off=lumenrl:logs/r3off.log") == SourceSpec("r3-off=lumenrl:logs/r3off.log", "r3-off",
                                                                      "lumenrl", "logs/r3off.log")
    assert parse_source("jsonl:x/metrics.jsonl").kind == "verl"  # another name for the same reader
    assert parse_source("wandb:exports/a=b.csv").label is None  # '=' inside the path is not a label
    with pytest.raises(MetricsError, match=r"unknown source kind 'tensorboard' \(use one of run, wandb"):
        parse_source("tensorboard:events.out")
    with pytest.raises(MetricsError, match="no path after the source kind"):
        parse_source("wandb:")


def test_the_kind_is_read_from_the_content(run_dir, tmp_path):
    assert detect_kind([run_dir]) == "run" and detect_kind([run_dir / "metrics.jsonl"]) == "run"
    assert detect_kind([DATA / "lumenrl" / "train.log"]) == "lumenrl"
    assert detect_kind([DATA / "lumenrl" / "old_zero_based.log"]) == "lumenrl"
    assert detect_kind([DATA / "wandb" / "lumenrl_history.csv"]) == "wandb"
    assert detect_kind([DATA / "wandb"]) == "wandb"
    assert detect_kind([DATA / "verl" / "metrics.jsonl"]) == "verl"
    renamed = tmp_path / "history.txt"  # a W&B export without its .csv suffix
    shutil.copy(DATA / "wandb" / "lumenrl_history.csv", renamed)
    assert detect_kind([renamed]) == "wandb"
    printed = tmp_path / "console.log"  # a log that opens with a printed config dict is still a log
    printed.write_text("{'cluster': {'num_nodes': 3}}\n" + (DATA / "lumenrl" / "train.log").read_text())
    assert detect_kind([printed]) == "lumenrl"
    (tmp_path / "notes.txt").write_text("step 1 went fine\nthen step 2\n")
    with pytest.raises(MetricsError, match=r"notes\.txt: cannot tell what this is .* prefix the kind: run:, wandb:"):
        detect_kind([tmp_path / "notes.txt"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(MetricsError, match=r"empty: a folder without metrics\.jsonl"):
        detect_kind([tmp_path / "empty"])


def test_each_kind_loads_and_labels_default_to_the_name(run_dir):
    run = load_source(str(run_dir))
    assert (run.kind, run.label, run.recipe.name) == ("repro", "tiny", "tiny-cpu")
    log = load_source(DATA / "lumenrl" / "train.log")
    assert (log.kind, log.label, len(log.train)) == ("lumenrl", "train", 12)
    panels = load_source("wandb:" + str(DATA / "wandb" / "panel_*.csv"))  # a glob of one run's panel exports
    assert (panels.kind, panels.label, panels.train.index.tolist()) == ("wandb", "wandb", [1, 2, 3, 4, 6, 8, 10])
    verl = load_source("mine=verl:" + str(DATA / "verl" / "metrics.jsonl"))
    assert (verl.kind, verl.label) == ("jsonl", "mine")
    with pytest.raises(MetricsError, match=r"no such file or folder"):
        load_source(str(DATA / "nope.log"))
    with pytest.raises(MetricsError, match=r"matches 5 files; only W&B exports of one run may be several files"):
        load_source("lumenrl:" + str(DATA / "lumenrl" / "*.log"))


def test_several_sources_keep_their_order_and_get_unique_labels(run_dir):
    loaded = load_sources([str(run_dir), str(DATA / "lumenrl" / "train.log"),
                           "lumenrl:" + str(DATA / "lumenrl" / "train.log")])
    assert [f.label for f in loaded] == ["tiny", "train", "train (2)"]
    assert default_output_dir(loaded) == run_dir
    assert default_output_dir(loaded[1:]) == repro.REPO_DIR / "runs" / "compare"


def test_the_notebook_parameter_resolves_like_notebook_setup_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # JupyterLab's kernel starts elsewhere than the project root
    assert resolve_source_parameter("runs/tiny-cpu", "runs/tiny-cpu") == [str(repro.REPO_DIR / "runs" / "tiny-cpu")]
    typed = resolve_source_parameter(["cl=run:runs/a", "lumenrl:logs/x.log", "/abs/y.csv"], "runs/tiny-cpu")
    assert typed == [f"cl=run:{tmp_path / 'runs' / 'a'}", f"lumenrl:{tmp_path / 'logs' / 'x.log'}", "/abs/y.csv"]


def _cli(module, argv):
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return module.run(parser.parse_args(argv))


@pytest.mark.parametrize("source", ["run", "lumenrl/train.log", "wandb/lumenrl_history.csv", "wandb:wandb/panel_*.csv",
                                    "verl/metrics.jsonl"])
def test_compare_command_on_each_kind(source, run_dir, tmp_path, capsys):
    from repro.commands import compare

    text = str(run_dir) if source == "run" else (source.split(":")[0] + ":" + str(DATA / source.split(":")[1])
                                                 if ":" in source else str(DATA / source))
    assert _cli(compare, [text, "--out", str(tmp_path / "c.md")]) == 0
    out = capsys.readouterr().out
    assert "| metric | AMD | this run |" in out and "where the numbers are not AMD's quantity" in out
    assert (tmp_path / "c.md").read_text().startswith("# ")


def test_compare_command_on_three_sources(run_dir, capsys):
    from repro.commands import compare

    sources = [f"tiny={run_dir}", f"lumenrl={DATA / 'lumenrl' / 'train.log'}",
               f"verl={DATA / 'verl' / 'metrics.jsonl'}"]
    assert _cli(compare, sources) == 0
    out = capsys.readouterr().out
    assert "| metric | AMD | tiny | lumenrl | verl |" in out
    assert "| rollout tokens/s, mean | 311.0 | " in out and "| — (no `perf/rollout_tokens_per_s`) |" in out
    assert (run_dir / "comparison.md").read_text().startswith("# tiny, lumenrl, verl: comparison")
