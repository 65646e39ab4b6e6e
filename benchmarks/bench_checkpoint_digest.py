"""What a content digest per checkpoint file costs, for the hashes this venv has, per GB.

    flock /work/heavy.lock .venv/bin/python benchmarks/bench_checkpoint_digest.py [--gb 1] [--json out.json]

MEASURED, each from the page cache (the file read once before timing, best of --repeat; the cost of the hash on
top of reading, which a checkpoint just written or about to be loaded pays too):
- every candidate over a ``--gb`` GB file of random bytes (one 8 MiB buffer, ``readinto``), and a plain read;
- the same over the tiny recipe's checkpoint (a real ``step_*/`` folder written by ``save_checkpoint`` after one
  AdamW update: 8 files, ~31 MB), file by file as ``seal_checkpoint`` hashes them;
- ``seal_checkpoint`` and ``check_complete(verify=True)`` themselves on that checkpoint (XXH3-128, threads).
Candidates: xxhash's XXH3-128 / XXH3-64 / XXH64 (the xxhash package), hashlib's BLAKE2b, SHA-256 and MD5, zlib's
CRC-32. Not measured: a cold read from disk (bounded by the disk, the same for every hash).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CHUNK = 1 << 23


class _Crc32:
    def __init__(self):
        self.value = 0

    def update(self, data):
        self.value = zlib.crc32(data, self.value)


class _Read:
    def update(self, data):
        pass


def candidates() -> dict:
    import xxhash

    return {"read only": _Read, "xxh3_128": xxhash.xxh3_128, "xxh3_64": xxhash.xxh3_64, "xxh64": xxhash.xxh64,
            "crc32": _Crc32, "blake2b": hashlib.blake2b, "sha256": hashlib.sha256, "md5": hashlib.md5}


def hash_files(paths: list[Path], make) -> None:
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    for path in paths:
        digest = make()
        with open(path, "rb", buffering=0) as handle:
            while n := handle.readinto(buffer):
                digest.update(view[:n])


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def tiny_checkpoint(folder: Path) -> Path:
    """A real checkpoint of the tiny recipe's embedded trainer, as a run writes it."""
    import torch

    from repro.recipes import load_recipe
    from repro.run.checkpoints import save_checkpoint
    from repro.run.run_dir import resolve_model_dir
    from repro.train.embedded import EmbeddedTrainer

    torch.set_num_threads(1)
    recipe = load_recipe("tiny-cpu")
    trainer = EmbeddedTrainer.from_recipe(recipe, resolve_model_dir(recipe))
    generator = torch.Generator().manual_seed(0)
    for p in trainer.opt.model_params:  # one AdamW update, so the optimizer's moments exist as after step 1
        p.grad = torch.randn(p.shape, generator=generator).to(p.dtype)
    trainer.opt.step(lr=1e-3)
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "metrics.jsonl"
    log.write_text('{"kind": "train", "step": 1, "reward/accuracy": 0.5}\n')
    return save_checkpoint(folder / "checkpoints", 1, trainer, {"weight_version": 1}, log, keep_last=1).path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="size of the large file in GB (default 1)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    from repro.run.checkpoints import check_complete, seal_checkpoint

    results = {"cpu": os.uname().machine, "cores": os.cpu_count(), "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        big = tmp / "big.bin"
        size = int(args.gb * 1e9)
        with open(big, "wb") as handle:
            left = size
            while left:
                piece = min(left, 1 << 26)
                handle.write(os.urandom(piece))
                left -= piece
        checkpoint = tiny_checkpoint(tmp / "run")
        files = sorted(p for p in checkpoint.rglob("*") if p.is_file() and p.name != "COMPLETE")
        tiny_bytes = sum(p.stat().st_size for p in files)
        for label, paths, nbytes in ((f"{args.gb:g} GB file", [big], size),
                                     (f"tiny checkpoint ({len(files)} files)", files, tiny_bytes)):
            hash_files(paths, _Read)  # into the page cache
            for name, make in candidates().items():
                seconds = best(lambda: hash_files(paths, make), args.repeat)
                results["rows"].append({"data": label, "bytes": nbytes, "hash": name, "seconds": seconds,
                                        "s_per_gb": seconds / nbytes * 1e9})
        (checkpoint / "COMPLETE").unlink()
        seal_s = best(lambda: seal_checkpoint(checkpoint, 1), args.repeat)

        def verify():
            from repro.run import checkpoints

            checkpoints._VERIFIED.clear()  # each call hashes again
            assert check_complete(checkpoint) is None

        verify_s = best(verify, args.repeat)
        results["tiny_checkpoint"] = {"bytes": tiny_bytes, "seal_s": seal_s, "verify_s": verify_s}
    print(f"{'data':<28} {'hash':<10} {'seconds':>9} {'s per GB':>9}")
    for row in results["rows"]:
        print(f"{row['data']:<28} {row['hash']:<10} {row['seconds']:9.4f} {row['s_per_gb']:9.3f}")
    t = results["tiny_checkpoint"]
    print(f"tiny checkpoint ({t['bytes'] / 1e6:.1f} MB): seal_checkpoint {t['seal_s'] * 1e3:.1f} ms (fsync "
          f"included), check_complete(verify=True) {t['verify_s'] * 1e3:.1f} ms")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
