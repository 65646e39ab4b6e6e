"""Our mismatch metrics against LumenRL's own functions, on random batches (not a timed test: needs a LumenRL
checkout and omegaconf, which LumenRL's package imports).

    python benchmarks/lumenrl_metrics_equivalence.py /path/to/Lumen-RL   (branch dev/dsv4-grpo, 2232f55 or later)

Calls ``lumenrl.algorithms.rollout_correction.compute_rollout_correction_weights`` / ``compute_offpolicy_metrics``
and ``RLTrainer._mismatch_by_response_position`` (that static method is taken from the file's text and run alone,
so the trainer's heavy imports are not needed), and prints the largest relative difference per key over 20
batches of growing mismatch, for token-level weights (AMD's) and sequence-level ones. LumenRL computes the position
buckets in float32, we in float64. A key that one side logs and the other does not stops it (exit status 1).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import torch

from repro.algos.metrics import is_metrics, offpolicy_metrics, position_metrics


def lumenrl_position_function(checkout: Path):
    source = (checkout / "lumenrl/trainer/rl_trainer.py").read_text()
    start = source.index("    def _mismatch_by_response_position(")
    end = source.index("\n    def ", start + 10)
    namespace = {"torch": torch}
    exec(textwrap.dedent(source[start:end]).replace("@staticmethod", ""), namespace)  # LumenRL's own code, trusted
    return namespace["_mismatch_by_response_position"]


def random_batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    rows, length = 16, 700
    mask = torch.zeros(rows, length)
    for b in range(rows):
        size = int(torch.randint(1, length, (1,), generator=g))
        begin = int(torch.randint(0, length - size + 1, (1,), generator=g))
        mask[b, begin:begin + size] = 1
    old = -torch.rand(rows, length, generator=g, dtype=torch.float64) * 3
    roll = old + torch.randn(rows, length, generator=g, dtype=torch.float64) * (0.05 + seed * 0.1)
    return old, roll, mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(args.checkout))
    from lumenrl.algorithms import rollout_correction as lumen

    by_position = lumenrl_position_function(args.checkout)
    worst: dict[str, float] = {}

    def record(key: str, theirs: float, ours: float) -> None:
        worst[key] = max(worst.get(key, 0.0), abs(ours - theirs) / max(abs(theirs), 1e-12))

    for seed, level in ((seed, level) for level in ("token", "sequence") for seed in range(20)):
        old, roll, mask = random_batch(seed)
        _, theirs = lumen.compute_rollout_correction_weights(old - roll, mask.double(), rollout_is=level,
                                                             rollout_is_threshold=2.0)
        theirs.update({k: float(v) for k, v in lumen.compute_offpolicy_metrics(old, roll, mask.double()).items()})
        ours = {**is_metrics(old, roll, mask, level, 2.0), **offpolicy_metrics(old, roll, mask)}
        if set(theirs) != set(ours):
            raise SystemExit(f"{level} level: only LumenRL logs {sorted(set(theirs) - set(ours))}, "
                             f"only repro logs {sorted(set(ours) - set(theirs))}")
        for key in sorted(theirs):
            record(f"{level}:{key}" if key.startswith("rollout_is") else key, theirs[key], ours[key])
        theirs_pos, ours_pos = by_position(old, roll, mask), position_metrics(old, roll, mask)
        if set(theirs_pos) != set(ours_pos):
            raise SystemExit(f"position keys differ: {sorted(set(theirs_pos) ^ set(ours_pos))}")
        for key in theirs_pos:
            record("pos_*/" + key.rsplit("/", 1)[1], theirs_pos[key], ours_pos[key])
    for key, value in sorted(worst.items()):
        print(f"{key:48s} largest relative difference {value:.2e}")


if __name__ == "__main__":
    main()
