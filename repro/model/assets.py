"""The shipped warm-started tiny checkpoint: where it lives, its recorded hashes, and how to regenerate it.

Layout (package data, ``repro/assets/**``)::

    repro/assets/tiny-dsv4-warm/            HF checkpoint folder (+ warmstart.json: provenance and accuracies)
    repro/assets/tiny-dsv4-warm.sha256      ``sha256sum -c`` format, one line per file of the folder

Regenerating gives bit-identical weights for a given seed and thread count on one machine (another CPU may
round differently), but ``warmstart.json`` records wall times and load, so its hash never repeats: a
regenerated folder gets its hashes recorded afresh.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from repro import PACKAGE_DIR
from repro.errors import ReproError

TINY_ASSET_NAME = "tiny-dsv4-warm"
REGENERATE_COMMAND = f"python -m repro warmstart --out repro/assets/{TINY_ASSET_NAME} --seed 0"
# The same model warm-started on tiny-math-long (recipe tiny-cpu-long); the command is also in its warmstart.json.
LONG_ASSET_NAME = "tiny-dsv4-long-warm"
LONG_REGENERATE_COMMAND = (f"python -m repro warmstart --out repro/assets/{LONG_ASSET_NAME} --seed 0 --terms 12 "
                           "--batch-size 32 --first-eval-step 100 --eval-problems 32 --max-steps 800")


class AssetError(ReproError):
    """A shipped asset is missing or does not match its recorded hashes."""


def tiny_checkpoint_path() -> Path:
    """The shipped warm-started tiny checkpoint folder (may be missing: see
    ``repro.model.warmstart_io.ensure_warm_checkpoint``)."""
    return PACKAGE_DIR / "assets" / TINY_ASSET_NAME


def hash_file_for(folder: str | Path) -> Path:
    folder = Path(folder)
    return folder.with_name(folder.name + ".sha256")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def folder_hashes(folder: str | Path) -> dict[str, str]:
    """file name -> sha256 for every plain file of ``folder`` (not recursive; checkpoints are flat)."""
    folder = Path(folder)
    return {p.name: sha256_of(p) for p in sorted(folder.iterdir()) if p.is_file()}


def record_hashes(folder: str | Path) -> Path:
    """Write ``<folder>.sha256`` next to ``folder`` (temp file, then rename); paths are relative to its parent."""
    folder = Path(folder)
    target = hash_file_for(folder)
    lines = "".join(f"{h}  {folder.name}/{name}\n" for name, h in folder_hashes(folder).items())
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    with os.fdopen(fd, "w") as handle:
        handle.write(lines)
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)
    return target


def read_recorded_hashes(folder: str | Path) -> dict[str, str]:
    folder = Path(folder)
    source = hash_file_for(folder)
    if not source.is_file():
        raise AssetError(f"{source} (the recorded hashes of {folder}) is missing")
    recorded = {}
    for number, line in enumerate(source.read_text().splitlines(), 1):
        digest, _, rel = line.partition("  ")
        prefix = folder.name + "/"
        if len(digest) != 64 or not rel.startswith(prefix):
            raise AssetError(f"{source}:{number}: expected '<sha256>  {prefix}<file>', got {line!r}")
        recorded[rel[len(prefix) :]] = digest
    return recorded


def verify_hashes(folder: str | Path) -> None:
    """Raise AssetError naming each file of ``folder`` that is missing, extra, or differs from its record."""
    recorded, actual = read_recorded_hashes(folder), folder_hashes(folder)
    problems = [f"{name}: missing" for name in recorded if name not in actual]
    problems += [f"{name}: not recorded" for name in actual if name not in recorded]
    problems += [f"{name}: sha256 differs" for name in recorded if name in actual and actual[name] != recorded[name]]
    if problems:
        raise AssetError(f"{folder} does not match {hash_file_for(folder)}: " + "; ".join(problems))
