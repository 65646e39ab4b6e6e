"""Children repro starts get SIGINT at its default disposition, whatever repro itself inherited.

A shell starts a background job (``make test &``, ``nohup make repro &``, a CI script's ``cmd &``) with SIGINT
ignored, and an ignored signal stays ignored across fork and exec. LumenRL would then never see the SIGINT we stop
it with (its ``main`` turns SIGINT into ``trainer.cleanup()``), and we would fall through to SIGTERM and SIGKILL.
A handled signal is reset to the default at exec, an ignored one is not, so the child must undo it itself.

Python's ``subprocess`` cannot do that without ``preexec_fn`` (``restore_signals`` covers SIGPIPE, SIGXFZ and
SIGXFSZ only), and ``preexec_fn`` is not safe in a process with threads (Ray's, papermill's). So the child is
started through a few lines run by this interpreter, which set SIGINT to the default and ``exec`` the real
command: same pid, same process group and session, same environment and working directory. ``-I -S``: the
launcher imports only built-in modules, nothing from the environment the real command is given.
"""

from __future__ import annotations

import sys

# sys.argv of `python -c CODE cmd args...` is ["-c", cmd, args...]
_LAUNCHER = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])"


def with_default_sigint(command: list[str]) -> list[str]:
    """``command`` started through the launcher: it runs with SIGINT at SIG_DFL (see the module docstring)."""
    if not command:
        raise ValueError("with_default_sigint: empty command")
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, *command]

