"""An engine that is a program of its own (LumenRL's ``main``, verl's ``main_ppo``), started in a process group of
its own, recorded, and stopped cleanly: shared by the engines that launch one (``repro.lumenrl``, ``repro.verl``).

We never match processes by name (a name would also hit other users' jobs and our own kernel's helpers): the
engine's driver leads a session and process group of its own, signals go to that group only, and the group an
earlier, killed launch left behind is ended only when its leader is still the very process recorded (pid *and*
start time). Stopping is SIGINT first (both engines turn it into their own clean-up), then SIGTERM, then SIGKILL,
each after a grace period. The child starts with SIGINT at its default whatever we inherited
(repro/child_signals.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from repro.child_signals import with_default_sigint

STOP_GRACE_S = 30.0


@dataclass
class EngineProcess:
    """An engine's driver, started in a session (and process group) of its own: signals to the group reach it and
    whatever it forked, never this process or its other children."""

    popen: subprocess.Popen
    log: Path
    command: list[str]  # the engine's, without the launcher it is started through

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def group_alive(self) -> bool:
        return bool(live_members(self.pid))

    def stop(self, grace_s: float = STOP_GRACE_S) -> list[str]:
        """SIGINT, SIGTERM, SIGKILL to the group, each after ``grace_s`` while it lives; the signals sent."""
        return stop_group(self.pid, grace_s, lambda: self.popen.poll() is not None and not self.group_alive())


def live_members(pgid: int) -> list[int]:
    """The processes of group ``pgid`` that still run (an exited child not yet reaped is not running)."""
    import psutil

    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (OSError, psutil.Error):
            continue
    return members


def stop_group(pgid: int, grace_s: float, done) -> list[str]:
    sent = []
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        if done():
            break
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        sent.append(sig.name)
        deadline = time.monotonic() + (grace_s if sig != signal.SIGKILL else 10.0)
        while time.monotonic() < deadline and not done():
            time.sleep(0.1)
    return sent


def start_process(command: list[str], env: dict[str, str], cwd: Path, log: Path) -> EngineProcess:
    """Start ``command`` with stdout and stderr appended to ``log`` (one file), SIGINT at its default whatever we
    inherited (the launcher execs the command in place: its pid is the group's)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        popen = subprocess.Popen(with_default_sigint(command), cwd=cwd, env={**os.environ, **env}, stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    return EngineProcess(popen, log, list(command))


def record_process(path: Path, process: EngineProcess) -> None:
    import psutil

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"pid": process.pid, "create_time": psutil.Process(process.pid).create_time(),
                               "command": process.command}, indent=1))
    tmp.replace(path)


def end_recorded_process(path: Path, grace_s: float = STOP_GRACE_S) -> str | None:
    """Stop the group a killed earlier launch recorded, if that very process still runs; drop the record."""
    import psutil

    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        proc = psutil.Process(record["pid"])
        same = abs(proc.create_time() - record["create_time"]) < 1e-3 and os.getpgid(proc.pid) == proc.pid
    except (OSError, ValueError, KeyError, psutil.Error):
        same = False
    ended = None
    if same:
        stop_group(record["pid"], grace_s, lambda: not live_members(record["pid"]))
        ended = f"{record['pid']} ({' '.join(record.get('command', [])[:4])} ...)"
    path.unlink(missing_ok=True)
    return ended
