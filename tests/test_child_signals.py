"""repro.child_signals: a child started through the launcher has SIGINT at its default even when this process
ignores it (as `make test &` and `nohup make repro &` leave it), with the same pid and its arguments untouched."""

import json
import os
import signal
import subprocess
import sys

import pytest

from lumenrl_support import sigint_ignored
from repro.child_signals import with_default_sigint

REPORT = ("import json, os, sys\n"
          "mask = next(l.split()[1] for l in open('/proc/self/status') if l.startswith('SigIgn:'))\n"
          "print(json.dumps({'pid': os.getpid(), 'sigint_ignored': bool(int(mask, 16) & 2), 'argv': sys.argv[1:]}))")


@pytest.fixture
def ignoring_sigint():
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert sigint_ignored(os.getpid())
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _report(command):
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    return process.pid, json.loads(out)


def test_the_launcher_gives_the_child_the_default_sigint_in_place(ignoring_sigint):
    child = [sys.executable, "-c", REPORT, "a b", "--x=1", ""]
    pid, plain = _report(child)
    assert plain["sigint_ignored"] is True and plain["pid"] == pid  # the control: inherited as ignored
    pid, launched = _report(with_default_sigint(child))
    assert launched == {"pid": pid, "sigint_ignored": False, "argv": ["a b", "--x=1", ""]}


def test_a_handled_sigint_needs_no_launcher_and_the_launcher_keeps_the_environment(monkeypatch):
    """The other half of the rule the launcher relies on: a handled signal is reset at exec, so only an ignored one
    is inherited. The launcher itself runs isolated (-I), yet the command gets this environment, PYTHONPATH included."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # set here: under `make test &` it is SIG_IGN
    try:
        _, plain = _report([sys.executable, "-c", REPORT])
    finally:
        signal.signal(signal.SIGINT, before)
    assert plain["sigint_ignored"] is False
    monkeypatch.setenv("PYTHONPATH", "/nowhere/for/the/launcher")
    show = "import sys; print('/nowhere/for/the/launcher' in sys.path)"
    out = subprocess.run(with_default_sigint([sys.executable, "-c", show]), capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (0, "True\n")


def test_an_empty_command_is_refused():
    with pytest.raises(ValueError, match="empty command"):
        with_default_sigint([])
