"""Writes three fixtures from formulas (run from the project root: python tests/data/lumenrl/make_eval_positions.py).

- tests/data/lumenrl/eval_positions.log and tests/data/wandb/eval_positions_history.csv: one 10-step run as LumenRL
  2232f55 writes it on its DeepSeek-V4 Ray path, to the console and to W&B: an EvalCallback evaluation after the first
  update (``eval.enabled``), validation merged into every 5th step line (``val_steps: 5``), the response-position
  mismatch keys ``rollout_corr/pos_*`` every step (a bucket without tokens -- the last one at step 2 -- is not
  logged), and no ``mismatch/*`` keys (only LumenRL's FSDP loss makes those).
- tests/data/lumenrl/synthetic_positions_75.log: a SYNTHETIC 75-step console log of the same shape (evaluations
  after step 1 and every 5 steps), made up for drawing KL by response position; its numbers are invented curves,
  not measurements of anything.

Shapes as read in LumenRL's source at 2232f55: ``LoggingCallback`` (callbacks.py:45-52: ``step=N`` 1-based, keys
sorted, ``%.6g``), ``EvalCallback`` (callbacks.py:271-278: ``eval step=N`` with N = step + 1, then the values merged
into the step's metrics), ``WandbCallback`` (callbacks.py:348-389: every key, ``train/`` mirrors of all but
``train/``/``val-``/``val/`` keys, ``core/`` copies, ``train/global_step`` = step + 1 = the W&B step, a
``val/generations`` table on evaluation rows), the logging format of main.py:28-31, the callback order of
main.py:106-123 (logging, checkpoint, eval, W&B), ``run_validation``'s own ``[eval] step=N`` messages
(rl_trainer.py:4237-4241, 4367-4373) and ``_mismatch_by_response_position`` (rl_trainer.py:3717-3743).

Every value is rounded to six significant digits before it is written, so the console's ``%.6g`` and the CSV's full
precision hold the same numbers and the tests can compare them exactly.
"""

import calendar
import csv
import math
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUCKETS = ((0, 128), (128, 512), (512, 1024), (1024, 2048), (2048, 4096))
T0 = calendar.timegm((2026, 8, 17, 9, 0, 0))  # the run's start (AMD's run began on 17 August)
CORE = {"reward/mean": "core/reward_mean", "seq/mean_response_len": "core/response_len_mean",
        "timing/step_s": "core/step_time_s", "timing/gen_s": "core/gen_time_s", "timing/train_s": "core/train_time_s",
        "rollout_corr/kl": "core/kl", "entropy": "core/entropy", "grad_norm": "core/grad_norm", "loss": "core/loss"}


def g6(x: float) -> float:
    return float(f"{x:.6g}")


def positions(step: int, steps: int, skip_last: bool) -> dict[str, float]:
    """Per-bucket mismatch: grows with the position in the response and over the run (the drift AMD reports for long
    sequences), with a small deterministic wiggle."""
    out = {}
    for b, (start, end) in enumerate(BUCKETS):
        if skip_last and b == len(BUCKETS) - 1:
            continue
        base = 0.002 * (b + 1) ** 1.5 * (1 + 2.0 * step / steps)
        wiggle = 1 + 0.15 * math.sin(1.7 * step + b)
        tokens = [8192, 24576, 30720 - 40 * step, 42000 + 90 * step, 15000 + 120 * step][b]
        prefix = f"rollout_corr/pos_{start}_{end - 1}"
        out[f"{prefix}/tokens"] = float(tokens)
        out[f"{prefix}/kl"] = g6(base * wiggle * (-1 if b == 0 and step % 2 else 1))
        out[f"{prefix}/abs_diff"] = g6(6 * base * wiggle)
        out[f"{prefix}/k3_kl"] = g6(0.8 * base * wiggle)
    return out


def step_metrics(step: int, steps: int, val_steps: int, skip_last: bool) -> dict[str, float]:
    accuracy = g6(0.40 + 0.19 * step / steps + 0.05 * math.sin(2.3 * step))
    pos = positions(step, steps, skip_last)
    tokens = sum(v for k, v in pos.items() if k.endswith("/tokens"))
    kl = g6(sum(pos[k] * pos[k.replace("/kl", "/tokens")] for k in pos if k.endswith("/kl")) / tokens)
    k3 = g6(sum(pos[k] * pos[k.replace("/k3_kl", "/tokens")] for k in pos if k.endswith("/k3_kl")) / tokens)
    validate = step % val_steps == 0
    testing = 95.5 if validate else 1.2e-05
    m = {
        "actor/entropy": g6(0.6 - 0.002 * step), "actor/grad_norm": 0.25, "actor/loss": 0.01, "actor/lr": 1e-06,
        "actor/pg_loss": 0.01, "critic/score/mean": g6(2 * accuracy - 1), "entropy": g6(0.6 - 0.002 * step),
        "grad_norm": 0.25, "loss": 0.01, "lr": 1e-06, "response_length/mean": 1000.0 + 10 * step,
        "reward/accuracy": accuracy, "reward/mean": g6(2 * accuracy - 1), "rollout_corr/k3_kl": k3,
        "rollout_corr/kl": kl, "rollout_corr/rollout_is_eff_sample_size": g6(0.95 - 0.002 * step),
        "rollout_corr/rollout_is_mean": 1.001, "seq/mean_response_len": 1000.0 + 10 * step,
        "throughput/gen_tok_per_s": g6(315.2 - 0.09 * step), "timing/gen_s": 200.0 + step,
        "timing/step_s": 270.0 + step, "timing/train_s": 60.0, "timing/weight_sync_s": 12.5,
        "timing_s/gen": 200.0 + step, "timing_s/step": g6(283.5 + step + testing), "timing_s/testing": testing,
        "timing_s/update_actor": 60.0, "timing_s/update_weights": 12.5, **pos,
    }
    if validate:
        m.update(validation(step, steps))
    return m


def validation(step: int, steps: int) -> dict[str, float]:
    """run_validation's keys (rl_trainer.py:4334-4345) for 30 AIME problems x 8 samples."""
    acc = g6(round(0.30 + 0.19 * step / steps, 4))
    return {"val-core/acc/mean@8": acc, "val-core/math_dapo/acc/mean@8": acc,
            "val-aux/math_dapo/reward/mean@8": g6(2 * acc - 1), "val-aux/math_dapo/score/mean@8": g6(2 * acc - 1),
            "val-aux/num_turns/max": 1.0, "val-aux/num_turns/mean": 1.0, "val-aux/num_turns/min": 1.0,
            "val/score_mean": g6(2 * acc - 1), "val/response_length_mean": g6(3100.0 + 2.5 * step),
            "val/num_samples": 240.0}


def pairs(metrics: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.6g}" for k, v in sorted(metrics.items()))


def clock(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(T0 + seconds))


def write_run(steps: int, val_steps: int, skip_step: int | None, log_path: Path, csv_path: Path | None,
              header: list[str]) -> None:
    lines, rows = list(header), []
    lines.append(f"{clock(0)} [INFO] lumenrl.main: LumenRL starting: algo=grpo, "
                 f"model=/dev/shm/models/DeepSeek-V4-Flash-BF16, steps={steps}, async=False")
    for step in range(1, steps + 1):
        t = 290.0 * step
        metrics = step_metrics(step, steps, val_steps, skip_last=step == skip_step)
        validate = step % val_steps == 0
        if validate:  # the in-loop validation runs before the callbacks and is merged into the step line
            lines.append(f"{clock(t - 100)} [INFO] lumenrl.trainer.rl_trainer: [eval] step={step}: evaluating 30 "
                         f"prompts x 8 samples (temperature=0.8, top_p=0.7, batch_size=30)")
            lines.append(f"{clock(t - 5)} [INFO] lumenrl.trainer.rl_trainer: [eval] step={step} "
                         f"acc={metrics['val-core/acc/mean@8']:.4f} score_mean={metrics['val/score_mean']:.4f} "
                         f"resp_len={metrics['val/response_length_mean']:.1f} n=240")
        lines.append(f"Processed prompts: 100%|##########| 256/256 [03:20<00:00,  1.28it/s]\r(TaskRunner pid=4242) "
                     f"{clock(t)} [INFO] lumenrl.trainer.callbacks: step={step} {pairs(metrics)}")
        row = dict(metrics)
        if step == 1:  # EvalCallback: interval 1000 (the default) fires at the trainer's 0-based step 0 only
            evaluation = validation(step, steps)
            lines.append(f"{clock(t + 60)} [INFO] lumenrl.trainer.rl_trainer: [eval] step=1: evaluating 30 prompts "
                         "x 8 samples (temperature=0.8, top_p=0.7, batch_size=30)")
            lines.append(f"{clock(t + 150)} [INFO] lumenrl.trainer.rl_trainer: [eval] step=1 "
                         f"acc={evaluation['val-core/acc/mean@8']:.4f} score_mean={evaluation['val/score_mean']:.4f} "
                         f"resp_len={evaluation['val/response_length_mean']:.1f} n=240")
            lines.append(f"{clock(t + 150)} [INFO] lumenrl.trainer.callbacks: eval step=1 {pairs(evaluation)}")
            row.update(evaluation)
        if csv_path is not None:
            rows.append(wandb_row(step, t, row))
    log_path.write_text("\n".join(lines) + "\n")
    if csv_path is not None:
        columns = ["_step", "_runtime", "_timestamp", "train/global_step"]
        columns += sorted({k for r in rows for k in r} - set(columns))
        with open(csv_path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, columns)
            writer.writeheader()
            writer.writerows(rows)


def wandb_row(step: int, t: float, metrics: dict[str, float]) -> dict:
    payload = dict(metrics)
    payload.update({f"train/{k}": v for k, v in metrics.items() if not k.startswith(("train/", "val-", "val/"))})
    for src, dst in CORE.items():
        if src in metrics and dst not in payload:
            payload[dst] = metrics[src]
    if any(k.startswith("val-") for k in metrics):
        payload["val/generations"] = ('{"_type": "table-file", "path": '
                                      f'"media/table/val/generations_{step}_9c41.table.json"}}')
    return {"_step": step, "_runtime": t, "_timestamp": T0 + t, "train/global_step": step, **payload}


if __name__ == "__main__":
    data = HERE.parent
    write_run(10, 5, 2, HERE / "eval_positions.log", data / "wandb" / "eval_positions_history.csv", [])
    write_run(75, 5, None, HERE / "synthetic_positions_75.log", None, [
        "# SYNTHETIC: made up by tests/data/lumenrl/make_eval_positions.py, NOT a LumenRL run. The lines have the",
        "# shape LumenRL 2232f55 prints on its DeepSeek-V4 path (step lines, an EvalCallback line after step 1,",
        "# validation every 5 steps, rollout_corr/pos_* keys); the numbers are invented curves for drawing KL by",
        "# response position, not measurements."])
