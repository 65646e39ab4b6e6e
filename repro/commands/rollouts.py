"""`repro rollouts RUN --step N [--worst-kl K] [--json]`: a step's trajectories from RUN/rollouts/, as text.

Without --worst-kl every trajectory of the step is printed in batch order (prompt-major); with it, the K whose
per-sequence k3 KL between rollout and trainer is largest, worst first, each with the token of its largest
log-prob gap. --json prints the records themselves, one per line.
"""

from __future__ import annotations

import json
from pathlib import Path
from repro.errors import ReproError


def add_arguments(parser):
    parser.add_argument("run_dir", metavar="RUN", type=Path, help="a repro run directory")
    parser.add_argument("--step", type=int, required=True, help="the optimizer step")
    parser.add_argument("--worst-kl", type=int, default=None, metavar="K",
                        help="only the K trajectories with the largest per-sequence k3 KL, worst first")
    parser.add_argument("--max-chars", type=int, default=300,
                        help="cut prompts and responses to this many characters (0: whole; default 300)")
    parser.add_argument("--json", action="store_true", help="print the records as JSON lines")


def run(args) -> int:
    from repro.run.rollouts_file import read_rollouts, rollout_steps, rollouts_path

    if not args.run_dir.is_dir():
        raise ReproError(f"{args.run_dir}: no such folder (a repro run directory, e.g. runs/tiny-cpu)")
    path = rollouts_path(args.run_dir, args.step)
    if not path.is_file():
        steps = rollout_steps(args.run_dir)
        held = f"it holds steps {_ranges(steps)}" if steps else "it holds none (tracking.rollouts off, or no step yet)"
        raise ReproError(f"{path}: no rollouts of step {args.step}; {held}")
    if args.worst_kl is not None and args.worst_kl < 1:
        raise ReproError(f"--worst-kl {args.worst_kl}: give a count of 1 or more")
    records = read_rollouts(path)
    shown = records
    if args.worst_kl is not None:
        shown = sorted(records, key=lambda r: r["k3_kl"], reverse=True)[: args.worst_kl]
    if args.json:
        for record in shown:
            print(json.dumps(record, ensure_ascii=False))
        return 0
    print(step_summary(args.step, records))
    for record in shown:
        print()
        print(format_record(record, args.max_chars))
    return 0


def step_summary(step: int, records: list[dict]) -> str:
    """One line on the step: counts, accuracy, token-weighted k1/k3 KL and share above the cap (the step's
    ``rollout_corr/kl``, ``k3_kl`` and ``rollout_is_ratio_fraction_high`` in token mode)."""
    tokens = sum(r["length"] for r in records)
    k1 = sum(r["rollout_logprob_sum"] - r["trainer_logprob_sum"] for r in records) / tokens
    k3 = sum(r["k3_kl"] * r["length"] for r in records) / tokens
    above = sum(r["above_cap_share"] * r["length"] for r in records) / tokens
    accuracy = sum(r["acc"] for r in records) / len(records)
    truncated = sum(r["finish"] == "length" for r in records)
    return (f"step {step}: {len(records)} trajectories in {len({r['group'] for r in records})} groups, "
            f"{tokens} response tokens, accuracy {accuracy:.1%}, {truncated} cut at the length limit; "
            f"KL k1 {k1:.3e}, k3 {k3:.3e}; tokens above the TIS cap {above:.2%}")


def format_record(record: dict, max_chars: int) -> str:
    length = record["length"]
    k1 = (record["rollout_logprob_sum"] - record["trainer_logprob_sum"]) / length if length else 0.0
    head = (f"#{record['i']} group {record['group']} sample {record['sample']}: score {record['score']:+g} "
            f"(acc {int(record['acc'])}), advantage {record['advantage']:+.3f}, {length} tokens ({record['finish']}), "
            f"log-prob sums rollout {record['rollout_logprob_sum']:.4f} trainer {record['trainer_logprob_sum']:.4f}, "
            f"KL k1 {k1:+.3e} k3 {record['k3_kl']:.3e}, largest gap {record['max_gap']:.4f} at token "
            f"{record['max_gap_position']} {record['max_gap_token']!r}, above cap {record['above_cap_share']:.1%}")
    return "\n".join([head, f"  prompt:   {_cut(record['prompt'], max_chars)!r}",
                      f"  response: {_cut(record['response'], max_chars)!r}", f"  answer:   {record['answer']!r}"])


def _cut(text: str, max_chars: int) -> str:
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    return text[:max_chars] + f"... (+{len(text) - max_chars} chars)"


def _ranges(steps: list[int]) -> str:
    """[1, 2, 3, 5] -> '1-3, 5'."""
    spans, start, previous = [], steps[0], steps[0]
    for step in steps[1:]:
        if step != previous + 1:
            spans.append((start, previous))
            start = step
        previous = step
    spans.append((start, previous))
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
