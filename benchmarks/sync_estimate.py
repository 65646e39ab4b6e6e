"""ESTIMATE half of ``benchmarks/bench_weight_sync.py``: its measured throughputs turned into seconds per step for
DeepSeek-V4-Flash's weight sync on AMD's cluster, and what each way of syncing adds beside the wire. Pure
arithmetic on stated assumptions (printed with the tables); nothing here is measured.
"""

from __future__ import annotations


def extrapolate(model_gb: float = 568.0, link_gbit: float = 400.0, stages: int = 4, rollout_nics: int = 8,
                rollout_gpus: int = 8, fp8_s_per_gb: float | None = None, crc_gbps: float | None = None
                ) -> list[dict]:
    """ESTIMATE, seconds per step to move ``model_gb`` of BF16 trainer -> rollout node, per sender at two rates:
    80% of one NIC's line rate, and verl's measured 8.25 GB/s (NCCL over 400 Gb/s InfiniBand, 16.5% of line
    rate). One sender (LumenRL: actor rank 0 broadcasts every bucket on one RCCL group) is bound by one NIC;
    one sender per pipeline stage (slime) by ``stages`` NICs, capped by the rollout node's ``rollout_nics``,
    and only if the receivers take the stages' streams concurrently (repro's receivers take them one after
    another, so repro's own time is the one-sender row). FP8 re-quantisation: ``model_gb`` at
    ``fp8_s_per_gb`` spread over ``rollout_gpus`` workers. With ``crc_gbps``: each row's ``costs`` per way of
    syncing (``sync_costs``); vLLM's engine has one source, so the per-stage rows leave it out."""
    rates = {"80% of line rate": link_gbit / 8 * 0.8, "verl's measured 8.25 GB/s": 8.25}
    rows = []
    for label, per_sender in rates.items():
        for scheme, senders in (("one sender (LumenRL)", 1), (f"one sender per stage (slime), PP{stages}", stages)):
            rate = per_sender * min(senders, rollout_nics)
            row = {"scheme": scheme, "per sender": label, "GB/s": rate, "transfer_s": model_gb / rate}
            if fp8_s_per_gb is not None:
                row["fp8_s"] = model_gb * fp8_s_per_gb / rollout_gpus
            if crc_gbps is not None:  # ours take the stages' streams in turn: one sender's rate at a time
                costs = sync_costs(model_gb, model_gb / per_sender, crc_gbps)
                row["costs"] = costs if senders == 1 else {k: v for k, v in costs.items() if k != "vLLM engine"}
            rows.append(row)
    return rows


# Per byte, what each way of syncing adds to the wire (ESTIMATE; the counts are read from the code):
#   ours before  -- sender: .to("cpu") to pack, .to(device) to broadcast (2 PCIe crossings), CRC-32 on one core;
#                   each receiver: .cpu() to check (1 crossing), CRC-32 on one core, load_weights back (1 crossing)
#   ours after   -- payloads stay on the GPUs: no crossing; the checksum reads the bytes on the device, sender and
#                   receiver (2 passes at device-memory speed)
#   vLLM engine  -- packed device buffers, no crossing, no checksum (one source rank only)
# Every step runs in turn per bucket in ours (pack, checksum, broadcast and wait, check, load), so they add up;
# receivers work in parallel with each other (each has its own link and core), so a receiver's costs count once.
SCHEMES = {
    "ours before": {"crossings": 4, "host_checksums": 2, "device_checksums": 0},
    "ours after": {"crossings": 0, "host_checksums": 0, "device_checksums": 2},
    "vLLM engine": {"crossings": 0, "host_checksums": 0, "device_checksums": 0},
}
PCIE_GBPS = 25.0            # host<->GPU copies from pageable memory per GPU (PCIe Gen5 x16 peak is 64 GB/s)
DEVICE_CHECKSUM_GBPS = 1000.0  # one read of HBM by a reduction: a fifth of MI308X's 5.3 TB/s peak


def sync_costs(model_gb: float, transfer_s: float, crc_gbps: float, pcie_gbps: float = PCIE_GBPS,
               device_checksum_gbps: float = DEVICE_CHECKSUM_GBPS) -> dict[str, dict[str, float]]:
    """ESTIMATE, seconds per step per scheme: the transfer, PCIe crossings, checksums, and their total."""
    out = {}
    for name, s in SCHEMES.items():
        crossing_s = model_gb * s["crossings"] / pcie_gbps
        checksum_s = model_gb * (s["host_checksums"] / crc_gbps + s["device_checksums"] / device_checksum_gbps)
        out[name] = {"transfer_s": transfer_s, "crossing_s": crossing_s, "checksum_s": checksum_s,
                     "total_s": transfer_s + crossing_s + checksum_s}
    return out


PUBLISHED = [
    ("verl checkpoint engine (verl/checkpoint_engine/README.md)", "Qwen3-30B-A3B-Base, 4x8 H100, ConnectX-7 "
     "400 Gb/s InfiniBand, NCCL or NIXL: ~7 s per sync at 8.25 GB/s (30 rollouts receiving)"),
    ("AMD DSV4-Flash run", "BF16 streamed over RDMA in 2,048 MB buckets, FP8 made on the rollout node; no sync time "
     "published"),
]


def print_costs(estimate: list[dict]) -> None:
    print(f"  {'scheme':<36} {'per sender':<26} {'way':<12} {'transfer':>8} {'PCIe':>7} {'checksum':>8} {'total':>7}")
    for row in estimate:
        for way, c in row.get("costs", {}).items():
            print(f"  {row['scheme']:<36} {row['per sender']:<26} {way:<12} {c['transfer_s']:7.1f}s "
                  f"{c['crossing_s']:6.1f}s {c['checksum_s']:7.1f}s {c['total_s']:6.1f}s")
