"""Run checkpoints: trainer state + loop state, written to a temp folder and renamed, newest N kept.

Layout: ``checkpoints/step_000025/`` holds ``trainer/`` (weights, optimizer, RNG: written by the trainer),
``loop_state.json`` (step, prompt-sampler position, driver RNG, weight version), ``metrics.jsonl`` (the log up
to that step), ``recipe.yaml`` (the recipe it was trained with: a resume is checked against it) and ``COMPLETE``
(the step and every file's size and content digest, written last, after every file is fsynced). A folder named
``step_*`` only ever appears by an atomic rename of a finished one, so a kill during a write leaves a ``.tmp-*``
folder that is ignored and cleaned up, and the previous checkpoint stands; a write that fails (a full disk)
removes its temp folder and raises naming the step.

A checkpoint is used (resumed from, exported) only when it verifies: every file ``COMPLETE`` lists is there, of
its size, and hashes to its digest (xxHash's XXH3-128: a checksum against corruption, not a signature; it costs
0.02-0.09 s per GB on one core here on top of reading the file, docs/owned-data.md). A checkpoint that
fails is skipped with one line naming the file, and a resume falls back to the newest one that verifies. A marker
without digests (written before they existed: the step alone, or sizes alone) or malformed is not trusted: such
a checkpoint is not used, and the line says why.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import torch

from repro.errors import CheckpointError, WorkerError

STATE_FILE = "loop_state.json"
COMPLETE_MARKER = "COMPLETE"
TMP_PREFIX = ".tmp-step_"
OLD_PREFIX = ".old-step_"
DIGEST = "xxh3_128"
_VERIFIED: dict[tuple, None] = {}  # checkpoints whose digests matched, keyed by every listed file's stat


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path

    @property
    def trainer_dir(self) -> Path:
        return self.path / "trainer"

    def loop_state(self) -> dict:
        return json.loads((self.path / STATE_FILE).read_text())


def driver_rng_state() -> dict:
    version, internal, gauss = random.getstate()
    return {"python": [version, list(internal), gauss], "torch": torch.get_rng_state().tolist()}


def restore_driver_rng(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_digest(path: Path, chunk: int = 1 << 23) -> str:
    """XXH3-128 of the file's bytes, hex (read in 8 MiB pieces into one buffer)."""
    import xxhash

    digest, buffer = xxhash.xxh3_128(), bytearray(chunk)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while True:
            n = handle.readinto(buffer)
            if not n:
                break
            digest.update(view[:n])
    return digest.hexdigest()


def _digests(paths: list[Path]) -> list[str]:
    """``file_digest`` of each path, several files at once (xxhash lets go of the GIL while it hashes)."""
    if len(paths) <= 1:
        return [file_digest(p) for p in paths]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(len(paths), os.cpu_count() or 1, 8)) as pool:
        return list(pool.map(file_digest, paths))


def seal_checkpoint(folder: Path, step: int) -> None:
    """fsync every file and folder under ``folder``, then write the marker listing each file's size and digest."""
    paths = sorted(folder.rglob("*"))
    for path in paths:
        _fsync(path)
    paths = [p for p in paths if p.is_file() and p != folder / COMPLETE_MARKER]
    files = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, DIGEST: digest}
             for p, digest in zip(paths, _digests(paths))}
    marker = folder / COMPLETE_MARKER
    marker.write_text(json.dumps({"step": step, "digest": DIGEST, "files": files}, indent=1))
    _fsync(marker)
    _fsync(folder)


def save_checkpoint(root: str | Path, step: int, trainer, loop_state: dict, metrics_path: Path, keep_last: int,
                    recipe_path: Path | None = None) -> Checkpoint:
    """Write checkpoint ``step`` (module docstring): the trainer's state, the loop state, the log so far and the
    recipe it ran (``recipe_path``: a resume compares against it), sealed with every file's digest."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f"{TMP_PREFIX}{step:06d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir()
        trainer.save(tmp / "trainer")
        (tmp / STATE_FILE).write_text(json.dumps({**loop_state, "step": step}))
        if metrics_path.exists():
            shutil.copyfile(metrics_path, tmp / "metrics.jsonl")
        if recipe_path is not None and recipe_path.is_file():
            shutil.copyfile(recipe_path, tmp / "recipe.yaml")
        seal_checkpoint(tmp, step)
    except Exception as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, WorkerError) and err.died:
            raise  # the trainer's process is gone: a restart can go on, so it stays a worker's death
        newest = latest_checkpoint(root)
        free = shutil.disk_usage(root).free / 1e9
        standing = f"the newest complete checkpoint is {newest.path}" if newest else "no complete checkpoint yet"
        raise CheckpointError(f"checkpoint {final.name} not written: {err}; its temp folder {tmp} is removed "
                              f"({free:.2f} GB free there); {standing}") from err
    if final.exists():  # the same step written again: move the old one aside, so one complete copy always exists
        old = root / f"{OLD_PREFIX}{step:06d}"
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    _fsync(root)
    prune_checkpoints(root, keep_last)
    return Checkpoint(step, final)


def _listed(path: Path) -> tuple[dict | None, str | None]:
    """(COMPLETE's files, None), or (None, why the marker is not one this module can verify)."""
    marker = path / COMPLETE_MARKER
    if not marker.is_file() or not (path / STATE_FILE).is_file():
        return None, f"no {COMPLETE_MARKER} marker" if not marker.is_file() else f"no {STATE_FILE}"
    try:
        listed = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None, f"{COMPLETE_MARKER} is unreadable (not JSON)"
    if not isinstance(listed, dict):
        return None, f"{COMPLETE_MARKER} holds the step only (written before file digests): cannot be verified"
    files = listed.get("files")
    if not isinstance(files, dict) or not files:
        return None, f"{COMPLETE_MARKER} is malformed ('files' is not a mapping of file -> size and digest)"
    for name, entry in files.items():
        if isinstance(entry, int):
            return None, f"{COMPLETE_MARKER} lists sizes only (written before file digests): cannot be verified"
        relative = PurePosixPath(name)
        if relative.is_absolute() or ".." in relative.parts or not isinstance(entry, dict) \
                or not isinstance(entry.get("size"), int) or not isinstance(entry.get(DIGEST), str):
            return None, f"{COMPLETE_MARKER} is malformed at {name!r} (expected {{size, {DIGEST}}} of a file inside)"
    return files, None


def check_complete(path: Path, verify: bool = True) -> str | None:
    """Why the checkpoint folder ``path`` may not be used, naming the file, or None when it may: every file its
    marker lists is there and of its size, and (``verify``) hashes to its digest."""
    files, why = _listed(path)
    if why:
        return why
    stats = []
    for name, entry in files.items():
        file = path / name
        if file.is_symlink() or not file.is_file():
            return f"{name} is missing" if not file.is_symlink() else f"{name} is a link, not a file it wrote"
        stat = file.stat()
        if stat.st_size != entry["size"]:
            return f"{name} is {stat.st_size} bytes, {COMPLETE_MARKER} lists {entry['size']}"
        stats.append((name, stat.st_size, stat.st_mtime_ns, stat.st_ino, entry[DIGEST]))
    key = (str(path.resolve()), tuple(stats))
    if not verify or key in _VERIFIED:
        return None
    names = list(files)
    for name, digest in zip(names, _digests([path / n for n in names])):
        if digest != files[name][DIGEST]:
            return f"{name} does not match its digest in {COMPLETE_MARKER} (changed or corrupt since written)"
    _VERIFIED[key] = None
    return None


def _step_folders(root: Path) -> list[tuple[int, Path]]:
    found = []
    for path in root.glob("step_*"):
        number = path.name.removeprefix("step_")
        if number.isdigit() and path.is_dir() and not path.is_symlink():
            found.append((int(number), path))
    return sorted(found)


def list_checkpoints(root: str | Path) -> list[Checkpoint]:
    """The checkpoints whose marker lists digests and whose files are there at their sizes (not hashed: see
    ``usable_checkpoint``), oldest first."""
    root = Path(root)
    if not root.exists():
        return []
    return [Checkpoint(step, path) for step, path in _step_folders(root) if check_complete(path, verify=False) is None]


def usable_checkpoint(root: str | Path) -> tuple[Checkpoint | None, list[str]]:
    """The newest checkpoint that verifies (every file hashed against its digest), and one line for each folder
    a resume does not use, with why: a newer one that fails, an unfinished write, an older incomplete one."""
    root = Path(root)
    if not root.exists():
        return None, []
    notes = [f"{path} (a write that did not finish: removed at the next checkpoint)"
             for path in sorted(root.glob(f"{TMP_PREFIX}*"))]
    chosen = None
    for step, path in reversed(_step_folders(root)):
        why = check_complete(path, verify=chosen is None)
        if chosen is None and why is None:
            chosen = Checkpoint(step, path)
        elif why:
            notes.append(f"{path} ({why})")
    return chosen, notes


def incomplete_checkpoints(root: str | Path) -> list[str]:
    """Each checkpoint folder under ``root`` a resume will not use, with why (``usable_checkpoint``'s notes)."""
    return usable_checkpoint(root)[1]


def latest_checkpoint(root: str | Path) -> Checkpoint | None:
    """The newest checkpoint that verifies (None: none does)."""
    return usable_checkpoint(root)[0]


def prune_checkpoints(root: str | Path, keep_last: int) -> None:
    root = Path(root)
    for stale in [*root.glob(f"{TMP_PREFIX}*"), *root.glob(f"{OLD_PREFIX}*")]:
        shutil.rmtree(stale, ignore_errors=True)
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old.path)
