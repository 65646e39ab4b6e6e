"""STAND-IN for LumenRL's ``python -m lumenrl.trainer.main --config FILE key=value ...`` -- not LumenRL.

AMD's LumenRL needs its ROCm images and 24 GPUs; it cannot run here. This program tests *our* side of the seam
(repro.lumenrl: the config we write, how we start and stop the process, the log we stream, the checkpoints we
resume from). It reads the config repro wrote, then writes what LumenRL writes, in LumenRL's formats as read in its
source (dev/dsv4-grpo): log records ``%(asctime)s [%(levelname)s] %(name)s: %(message)s`` on stdout, one
``step=N k=v ...`` record per step (1-based, keys sorted, ``%.6g``), validation merged into every
``val_steps``-th step line, an ``EvalCallback`` line ``eval step=N ...`` after the step lines of the trainer's 0-based
steps 0, interval, ... when ``eval.enabled`` (N = step + 1: callbacks.py:271-277, main.py:115-116), Ray ``(Actor
pid=...)`` prefixes, progress bars with carriage returns, other messages that mention a step; checkpoints
``global_step_N/actor/`` + ``global_step_N/checkpoint_N.pt`` + ``latest_checkpointed_iteration.txt`` every
``save_steps``, pruned to ``save_total_limit``; resume from the tracker; ``Training failed.`` and exit 1 on an
error; SIGINT -> ``Training interrupted by user.``, exit 0.

Its numbers are formulas of the step (so tests can assert them exactly); a resumed attempt adds 0.001 to the
accuracy, so a row recomputed after a resume can be told from the one logged before the crash.
Environment knobs (the test sets them): LUMENRL_STANDIN_STEP_S (seconds per step, default 0.2),
LUMENRL_STANDIN_DIE_AFTER (crash after logging and checkpointing that step), LUMENRL_STANDIN_IGNORE_SIGNALS=1
(ignore SIGINT and SIGTERM: only SIGKILL ends it).
"""

import argparse
import logging
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import yaml


def load_config(path, overrides):
    config = yaml.safe_load(Path(path).read_text())
    for item in overrides:
        dotted, value = item.split("=", 1)
        node = config
        *sections, leaf = dotted.split(".")
        for key in sections:
            node = node.setdefault(key, {})
        node[leaf] = yaml.safe_load(value)
    return config


def validation(step):
    return {"val-core/math_dapo/acc/mean@8": 0.30 + 0.01 * step,
            "val-core/math_dapo/reward/mean@8": 2 * (0.30 + 0.01 * step) - 1}


def step_metrics(step, resumed, validate):
    accuracy = 0.40 + 0.005 * step + (0.001 if resumed else 0.0)
    metrics = {
        "reward/accuracy": accuracy, "reward/mean": 2 * accuracy - 1, "critic/score/mean": 2 * accuracy - 1,
        "rollout_corr/kl": 0.0004 * step * (-1) ** step, "rollout_corr/k3_kl": 0.0002 * step,
        "rollout_corr/rollout_is_eff_sample_size": 0.95 - 0.001 * step, "mismatch/k3_kl": 0.0003 * step,
        "response_length/mean": 1000 + 10 * step, "seq/mean_response_len": 1000 + 10 * step,
        "throughput/gen_tok_per_s": 300 + step, "perf/throughput": 50 + step,
        "timing/gen_s": 200.0, "timing/train_s": 60.0, "timing/step_s": 270.0 + step,
        "timing_s/step": 280.0 + step + (30.0 if validate else 0.0), "timing_s/gen": 200.0,
        "timing_s/testing": 30.0 if validate else 1.2e-05, "timing/weight_sync_s": 12.5,
        "actor/grad_norm": 0.25, "actor/lr": 1e-06, "actor/ppo_kl": float("nan"), "loss": 0.01,
    }
    if validate:
        metrics.update(validation(step))
    return metrics


def save_checkpoint(root, step, keep):
    step_dir = root / f"global_step_{step}"
    (step_dir / "actor").mkdir(parents=True, exist_ok=True)
    (step_dir / "actor" / "model_world_size_16_rank_0.pt").write_bytes(b"stand-in actor shard\n")
    # LumenRL's is a torch pickle; this one is deliberately no pickle at all: repro must never open it
    (step_dir / f"checkpoint_{step}.pt").write_bytes(b"stand-in: not a pickle\n")
    (root / "latest_checkpointed_iteration.txt").write_text(str(step), encoding="utf-8")
    logging.getLogger("lumenrl.trainer.callbacks").info("Saved Ray checkpoint to %s (global_step=%d)", step_dir, step)
    steps = sorted(int(p.name.split("_")[-1]) for p in root.glob("global_step_*"))
    for old in steps[:-keep]:
        shutil.rmtree(root / f"global_step_{old}")


def resume_step(root):
    tracker = root / "latest_checkpointed_iteration.txt"
    if tracker.is_file() and tracker.read_text().strip().isdigit():
        step = int(tracker.read_text().strip())
        if (root / f"global_step_{step}" / "actor").is_dir():
            return step
    return 0


def main():
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S"))
    logging.getLogger().handlers[:] = [handler]
    logging.getLogger().setLevel(logging.INFO)
    log, callbacks = logging.getLogger("lumenrl.main"), logging.getLogger("lumenrl.trainer.callbacks")
    trainer = logging.getLogger("lumenrl.trainer.rl_trainer")
    if os.environ.get("LUMENRL_STANDIN_IGNORE_SIGNALS") == "1":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    args, overrides = parser.parse_known_args()
    config = load_config(args.config, overrides)
    pace = float(os.environ.get("LUMENRL_STANDIN_STEP_S", "0.2"))
    die_after = int(os.environ.get("LUMENRL_STANDIN_DIE_AFTER", "0"))
    ck = config["checkpointing"]
    root = Path(ck["checkpoint_dir"])
    steps, val_steps = int(config["num_training_steps"]), int(config.get("val_steps") or 0)
    evaluation = config.get("eval") or {}
    eval_interval = int(evaluation.get("interval", 1000)) if evaluation.get("enabled") else 0
    log.info("LumenRL starting: algo=%s, model=%s, steps=%d, async=False", config["algorithm"]["name"],
             config["policy"]["model_name"], steps)
    print("NCCL INFO Using network IB", flush=True)
    print("(MegatronActorWorker pid=5121, ip=10.0.0.2) NCCL INFO ... NET/IB/0/GDRDMA ...", flush=True)
    start = resume_step(root) if ck.get("resume") else 0
    if start:
        trainer.info("Ray resume complete. Next training log will be global_step=%d.", start + 1)
    try:
        for step in range(start + 1, steps + 1):
            time.sleep(pace)
            validate = bool(val_steps) and step % val_steps == 0
            trainer.info("[step=%d] r3_verify tokens=251234 kl=0.0021 abs_diff=0.019", step - 1)
            if validate:
                trainer.info("[eval] step=%d acc=%.4f n=240", step, 0.30 + 0.01 * step)
            metrics = step_metrics(step, start > 0, validate)
            sys.stdout.write("Processed prompts: 100%|##########| 256/256 [03:20<00:00,  1.28it/s]\r"
                             "(TaskRunner pid=4242) ")
            callbacks.info("step=%d %s", step, " ".join(f"{k}={v:.6g}" for k, v in sorted(metrics.items())))
            if eval_interval and (step - 1) % eval_interval == 0:  # EvalCallback: after the trainer's 0-based step
                trainer.info("[eval] step=%d acc=%.4f n=240", step, 0.30 + 0.01 * step)
                callbacks.info("eval step=%d %s", step,
                               " ".join(f"{k}={v:.6g}" for k, v in sorted(validation(step).items())))
            if step % int(ck["save_steps"]) == 0:
                save_checkpoint(root, step, int(ck["save_total_limit"]))
            if step == die_after:
                raise RuntimeError("NCCL watchdog timeout (stand-in crash)")
        trainer.info("RLTrainer.train (ray-controller) finished after %d steps.", steps)
    except KeyboardInterrupt:
        log.info("Training interrupted by user.")
    except Exception:
        log.exception("Training failed.")
        sys.exit(1)
    log.info("LumenRL finished.")


if __name__ == "__main__":
    main()
