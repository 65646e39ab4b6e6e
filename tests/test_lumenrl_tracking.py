"""The recipe's tracking section with engine: lumenrl, on the STAND-IN for LumenRL (tests/standins; LumenRL needs
AMD's images and GPUs). Tested is our side: the logger keys we write into LumenRL's config, the W&B environment
we start it with (the same run id across a resume), and TensorBoard fed from the log we stream."""

from __future__ import annotations

import pytest
import yaml

from lumenrl_support import LONGRUN_2232F554, make_standin_checkout, nested, standin_overrides
from repro.lumenrl.config import flatten, lumenrl_config
from repro.lumenrl.launch import LumenRLError
from repro.recipes import load_recipe
from repro.run.metrics_log import MetricsLog
from repro.engines import run_recipe

AMD = "amd-dsv4-flash-mi308x"
ON_LUMENRL = ["engine=lumenrl", "lumenrl.path=/opt/Lumen-RL"]


def test_tracking_wandb_is_lumenrls_logger_and_off_keeps_the_published_names():
    base = nested(LONGRUN_2232F554)
    off = flatten(lumenrl_config(load_recipe(AMD, ON_LUMENRL), base, "/ck", resume=False))
    assert (off["logger.wandb_enabled"], off["logger.wandb.project"], off["logger.wandb.entity"]) == (
        False, "LumenRL", "danyzhan-amd")
    on = load_recipe(AMD, ON_LUMENRL + ["tracking.wandb.enabled=true", "tracking.wandb.project=dsv4",
                                        "tracking.wandb.name=try-1"])
    written = flatten(lumenrl_config(on, base, "/ck", resume=False))
    assert {k: v for k, v in written.items() if k.startswith("logger.")} == {
        "logger.wandb_enabled": True, "logger.log_interval": 1, "logger.wandb.project": "dsv4",
        "logger.wandb.entity": None, "logger.wandb.name": "try-1"}


@pytest.fixture
def standin(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMENRL_STANDIN_STEP_S", "0.05")
    return make_standin_checkout(tmp_path), tmp_path


def test_a_resumed_lumenrl_run_keeps_its_wandb_id_and_tensorboard_equals_the_log(standin, monkeypatch):
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    checkout, tmp_path = standin
    recipe = load_recipe(AMD, standin_overrides(checkout, tmp_path / "inputs", 8, save_every=2, eval_every=4)
                         + ["tracking.wandb.enabled=true", "tracking.tensorboard=true"])
    run_dir = tmp_path / "run"
    monkeypatch.setenv("LUMENRL_STANDIN_DIE_AFTER", "5")
    with pytest.raises(LumenRLError):
        run_recipe(recipe, run_dir, say=lambda line: None)
    run_id = (run_dir / "wandb" / "run_id").read_text().strip()
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(run_dir.resolve()), "WANDB_RUN_ID": run_id,
           "WANDB_RESUME": "allow"}
    script = (run_dir / "lumenrl" / "command.sh").read_text()
    assert all(f"export {k}={v}\n" in script for k, v in env.items())
    assert yaml.safe_load((run_dir / "lumenrl" / "config.yaml").read_text())["logger"]["wandb_enabled"] is True
    monkeypatch.delenv("LUMENRL_STANDIN_DIE_AFTER")
    run_recipe(recipe, run_dir, resume="auto", say=lambda line: None)
    script = (run_dir / "lumenrl" / "command.sh").read_text()
    assert f"export WANDB_RUN_ID={run_id}\n" in script  # the resumed LumenRL continues the same W&B run
    assert not list((run_dir / "wandb").glob("offline-run-*"))  # one writer per W&B run: LumenRL's, not ours
    assert not (run_dir / "rollouts").exists()

    accumulator = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0})
    accumulator.Reload()
    read = {(tag, e.step): tensor_util.make_ndarray(e.tensor_proto).item()
            for tag in accumulator.Tags()["tensors"] for e in accumulator.Tensors(tag)}
    rows = MetricsLog(run_dir / "metrics.jsonl").rows()
    expected = {(k, r["step"]): v for r in rows for k, v in r.items()
                if k not in ("step", "kind") and isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert read == expected
    assert read[("reward/accuracy", 5)] == pytest.approx(0.426)  # the recomputed step 5, not the crashed one's
