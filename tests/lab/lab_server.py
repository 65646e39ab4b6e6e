"""JupyterLab started the way `make lab` starts it, for the browser lane.

The two commands are read from the Makefile's ``lab`` target (so the lane cannot drift from what a person runs);
the lane adds only what a test needs: a free port on 127.0.0.1, its own token, no browser of its own,
and a private settings/workspace/runtime folder in which autosave is off, so running the notebooks never writes outputs
into the committed ``notebooks/*.ipynb``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from repro import REPO_DIR

MAKEFILE = REPO_DIR / "Makefile"


def make_lab_commands(makefile: Path = MAKEFILE, python: str = sys.executable) -> list[list[str]]:
    """The ``lab`` target's recipe lines as argument lists, preceded by those of its ``$(KERNEL)`` prerequisite
    (the kernel install), with $(PY) and $(VENV) of the interpreter running us. ($(STAMP), the venv itself, is the
    lane's own venv, built by `make test-lab`.)"""
    text = makefile.read_text()

    def rule(target: str) -> tuple[list[str], list[str]]:
        match = re.search(rf"^{re.escape(target)}:([^\n]*)\n((?:\t[^\n]*\n)+)", text, re.M)
        if not match:
            raise RuntimeError(f"{makefile}: no `{target}` rule with a recipe")
        return match.group(1).split(), [line.strip() for line in match.group(2).splitlines()]

    prerequisites, lines = rule("lab")
    if "$(KERNEL)" in prerequisites:
        lines = rule("$(KERNEL)")[1] + lines
    venv = str(Path(python).parent.parent)
    root_flag = "--allow-root" if os.geteuid() == 0 else ""
    return [shlex.split(line.replace("$(PY)", python).replace("$(VENV)", venv).replace("$(ROOT_FLAG)", root_flag))
            for line in lines]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LabServer:
    process: subprocess.Popen
    url: str
    token: str
    log_path: Path

    @property
    def login_url(self) -> str:
        """The server's URL with its token, as a person pastes it from the server's log."""
        return f"{self.url}?token={self.token}"

    def api(self, method: str, path: str) -> object:
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read()
        return json.loads(body) if body else None

    def shut_down_kernels(self) -> None:
        """End every session's kernel through the server (as the Running panel's "Shut Down All" does)."""
        for session in self.api("GET", "/api/sessions"):
            self.api("DELETE", f"/api/sessions/{session['id']}")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """End the server and its kernels: they share the process group we started it in."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        try:  # a kernel that outlived its server would still be in the group
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def private_settings(home: Path) -> dict[str, str]:
    """Environment for a JupyterLab whose user settings, workspaces and runtime files live under ``home``."""
    settings = home / "user-settings"
    # autosave off: running the notebooks must not write outputs into the committed files; no news prompt:
    # nothing may be fetched from outside, and its pop-up would cover the screenshots
    for plugin, values in (("docmanager-extension/plugin", {"autosave": False}),
                           ("apputils-extension/notification", {"fetchNews": "false"})):
        path = settings / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    (home / "workspaces").mkdir(exist_ok=True)
    return {"JUPYTERLAB_SETTINGS_DIR": str(settings), "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
            "JUPYTER_RUNTIME_DIR": str(home / "runtime")}


def start_lab(home: Path, token: str, timeout_s: float = 120) -> LabServer:
    """Install the project kernel and start JupyterLab as `make lab` does; wait until its API answers."""
    install, lab = make_lab_commands()
    subprocess.run(install, cwd=REPO_DIR, check=True, capture_output=True, text=True)
    port = free_port()
    env = {**os.environ, **private_settings(home)}
    command = lab + [f"--port={port}", "--ServerApp.port_retries=0", "--no-browser",
                     f"--IdentityProvider.token={token}"]
    log_path = home / "jupyterlab.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=REPO_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    server = LabServer(process, f"http://127.0.0.1:{port}", token, log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {process.returncode}:\n{server.log_tail()}")
        try:
            server.api("GET", "/api/status")
            return server
        except OSError:
            time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"JupyterLab did not answer on {server.url} within {timeout_s:.0f} s:\n{server.log_tail()}")
