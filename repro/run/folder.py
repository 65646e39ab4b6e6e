"""A run folder as the project's own: its lock, what may be written into it, and what ``fresh`` may remove.

- **Lock**: ``run.lock`` is held (flock) by the run using the folder; opened without following a link.
- **Written only through its own files**: a link inside the folder that leaves it (a folder copied, untarred or
  shared from someone else) is refused before anything is written, naming it; the files the run opens itself
  are created with ``O_NOFOLLOW`` (repro.owned). ``wandb/`` is W&B's (it links its debug logs to ~/.cache).
- **A new run starts in a new, empty or run-shaped folder**: one that holds other files (``~/thesis``) is refused.
- **fresh** removes a run's files, never anything else, and says what it removes before removing it:
  ``fresh=True`` (``--fresh``) only a *smoke* run's folder (a run of at most SMOKE_STEPS steps, per its
  recipe.yaml: the throwaway of notebook 02 and ``make repro``); a longer run only with the explicit word
  ``fresh="delete-run"`` (``--fresh delete-run``). Entries that are not the run layout's are kept and named.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from repro.errors import ReproError
from repro.owned import NotOurs, check_no_links_out, is_run_folder, open_no_follow
from repro.run.plan import SMOKE_STEPS

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe
    from repro.run.metrics_log import MetricsLog

LOCK_FILE = "run.lock"
FOREIGN = ("wandb",)  # written by W&B itself (its own links to ~/.cache among them); repro writes only its run_id
DELETE_RUN = "delete-run"  # the word that lets fresh remove a run longer than a smoke run
# What a run and the notebook chain write into a run folder (README's layout); fresh removes these, nothing else.
RUN_LAYOUT = frozenset({
    "recipe.yaml", "metrics.jsonl", "metrics.parquet", "data", "eval", "rollouts", "tensorboard", "wandb",
    "checkpoints", "logs", "lumenrl", "notebooks", "report", "comparison.md", "smoke", "fp8", "figures",
    ".write-probe",
})


def _layout(name: str) -> bool:
    return name in RUN_LAYOUT or (name.endswith(".tmp") and name.removesuffix(".tmp") in RUN_LAYOUT)


@contextmanager
def run_dir_lock(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir`` for this process while the block runs: a second run on the same folder (another shell,
    a notebook, a second node on a shared disk) fails at once, naming the holder, instead of writing every row
    twice. The kernel drops the lock when the holder exits, however it ends (kill -9 included)."""
    import fcntl

    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        handle = os.fdopen(open_no_follow(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT), "r+")
    except OSError as err:
        raise ReproError(f"run dir {run_dir}: cannot write there ({err.strerror or err})") from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "a process that has not written its name yet"
            raise ReproError(f"run dir {run_dir} is in use by another run ({holder}; lock {run_dir / LOCK_FILE}): "
                             "wait for it to end or stop it, or choose another --run-dir") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(sys.argv)[:300]}\n")
        handle.flush()
        yield


def check_run_folder(run_dir: Path, resume: bool) -> None:
    """Before a run writes: no link leaves the folder, and a new run does not move into someone's folder."""
    if not run_dir.is_dir():
        return
    check_no_links_out(run_dir, "run folder", "choose another --run-dir", skip=FOREIGN)
    if resume or is_run_folder(run_dir):
        return
    foreign = sorted(p.name for p in run_dir.iterdir() if not _layout(p.name) and p.name != LOCK_FILE
                     and not p.name.startswith("."))
    if foreign:
        shown = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
        raise NotOurs(f"run dir {run_dir} holds files that are not a run's ({shown}); a new run starts in a new, "
                      "empty or run folder: choose another --run-dir")


@dataclass
class Fresh:
    """What ``fresh`` removes from a run folder (``remove``) and leaves (``keep``: not the run's own)."""

    run_dir: Path
    remove: list[Path] = field(default_factory=list)
    keep: list[Path] = field(default_factory=list)

    def describe(self) -> str:
        if not self.remove:
            return f"fresh: {self.run_dir} holds no run yet; nothing to remove"
        names = ", ".join(p.name + ("/" if p.is_dir() and not p.is_symlink() else "") for p in self.remove)
        kept = f"; kept (not the run's): {', '.join(p.name for p in self.keep)}" if self.keep else ""
        return f"fresh: removing from {self.run_dir}: {names} ({_size(self.remove) / 1e6:.1f} MB){kept}"


def _size(paths: list[Path]) -> int:
    total = 0
    for path in paths:
        if path.is_symlink() or path.is_file():
            total += path.lstat().st_size
        else:
            total += sum(p.lstat().st_size for p in path.rglob("*") if not p.is_dir() or p.is_symlink())
    return total


def _run_steps(run_dir: Path) -> int | None:
    """The steps the folder's recipe.yaml says the run takes (None: no readable recipe)."""
    import yaml

    try:
        data = yaml.safe_load((run_dir / "recipe.yaml").read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return None
    steps = data.get("steps") if isinstance(data, dict) else None
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else None


def plan_fresh(run_dir: Path, fresh: bool | str) -> Fresh | None:
    """What ``fresh`` would remove from ``run_dir``, or a refusal (NotOurs) naming why; reads only."""
    if fresh is False or fresh is None:
        return None
    if fresh is not True and fresh != DELETE_RUN:
        raise ReproError(f"fresh={fresh!r}: expected False, True (a smoke run's folder) or {DELETE_RUN!r} (any run)")
    run_dir = Path(run_dir)
    plan = Fresh(run_dir)
    if not run_dir.exists():
        return plan
    if not run_dir.is_dir():
        raise NotOurs(f"run dir {run_dir}: not a folder; fresh removed nothing: choose another run dir")
    entries = sorted(p for p in run_dir.iterdir() if p.name != LOCK_FILE)
    if not entries:
        return plan
    if not is_run_folder(run_dir):
        raise NotOurs(f"run dir {run_dir} is not a run folder (no recipe.yaml or metrics.jsonl; it holds "
                      f"{', '.join(p.name for p in entries[:4])}); fresh removed nothing: choose another run dir")
    plan.remove = [p for p in entries if _layout(p.name)]
    plan.keep = [p for p in entries if not _layout(p.name)]
    steps = _run_steps(run_dir)
    if fresh is True and (steps is None or steps > SMOKE_STEPS):
        what = f"a run of {steps} steps" if steps is not None else "a run whose recipe.yaml cannot be read"
        raise NotOurs(f"run dir {run_dir} holds {what}, not a smoke run (at most {SMOKE_STEPS}); fresh=True removes "
                      f"only a smoke run: to delete this run say fresh={DELETE_RUN!r} (--fresh {DELETE_RUN}), "
                      "or choose another run dir")
    return plan


def clear_for_fresh(run_dir: Path, fresh: bool | str, say: Callable[[str], None] = print) -> None:
    """Remove what ``plan_fresh`` names, after saying so; the lock (held by the caller) and others' files stay."""
    plan = plan_fresh(run_dir, fresh)
    if plan is None:
        return
    say(plan.describe())
    for path in plan.remove:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()  # a file, or a link itself (never what it points at)


def record_resume(recipe: "Recipe", run_dir: Path, metrics: "MetricsLog", step: int, changes: dict[str, list],
                  say: Callable[[str], None]) -> None:
    """A resume that changed RESUMABLE fields ({field: [old, new]}, repro.recipes.resume), recorded where the run
    keeps its record: recipe.yaml rewritten, and a ``resume`` row at ``step`` in the log. Every engine calls it
    once its run has resumed (repro's loop) or is about to start its program (LumenRL, verl)."""
    from repro.recipes import dump_recipe  # pydantic: not for `repro smoke --help`, which reads this module
    from repro.recipes.resume import RECIPE_FILE, RESUME

    if not changes:
        return
    dump_recipe(recipe, run_dir / RECIPE_FILE)
    metrics.append({"kind": RESUME, "step": step, "changed": changes})
    say(f"resume: recipe.yaml updated ({'; '.join(f'{k}: {a!r} -> {b!r}' for k, (a, b) in changes.items())}), "
        f"recorded as a resume row in {metrics.path}")
