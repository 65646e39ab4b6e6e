"""What a local Ray instance started for the tiny recipe costs at rest: its processes and their memory.

    python benchmarks/ray_idle.py [--recipe tiny-cpu] [--settle 10]

Starts Ray as ``repro run`` does (``repro.cluster.runtime.ensure_ray``), waits ``--settle`` seconds for the
prestarted workers and agents to come up, lists every process this driver started (name, RSS, USS) and the
totals, then stops the instance. Run it with PYTHONPATH pointing at two checkouts to compare them; the counts
and the memory do not depend on the machine's load (start-up time does, and is printed only as such).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import psutil

from repro.cluster.runtime import ensure_ray, shutdown_ray
from repro.recipes import load_recipe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="tiny-cpu")
    parser.add_argument("--settle", type=float, default=10.0)
    args = parser.parse_args()
    started = time.perf_counter()
    info = ensure_ray(load_recipe(args.recipe))
    connect_s = time.perf_counter() - started
    time.sleep(args.settle)
    rows, kinds = [], Counter()
    for proc in psutil.Process().children(recursive=True):
        try:
            mem = proc.memory_full_info()
            name = " ".join(proc.cmdline())[:90] or proc.name()
            rows.append((mem.rss, mem.uss, proc.pid, name))
            kinds[proc.name()] += 1
        except psutil.Error:
            continue
    shutdown_ray()
    for rss, uss, pid, name in sorted(rows, reverse=True):
        print(f"{rss / 2**20:8.1f} MiB RSS {uss / 2**20:8.1f} MiB USS  {pid:>7}  {name}")
    print(f"processes: {len(rows)} ({', '.join(f'{k} {v}' for k, v in kinds.most_common())}); "
          f"RSS {sum(r[0] for r in rows) / 2**20:.0f} MiB, USS {sum(r[1] for r in rows) / 2**20:.0f} MiB; "
          f"CPUs offered {info.num_cpus:g}; start {connect_s:.1f} s (under the machine's current load)")


if __name__ == "__main__":
    main()
