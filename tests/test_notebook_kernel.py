"""repro.notebooks.kernel.ReproKernelManager, on a real ipykernel: its command goes through the SIGINT launcher;
an idle kernel is asked to quit and never sent SIGINT (the SIGINT jupyter_client sends first is what made ipykernel
log "KeyboardInterrupt caught in kernel." after `make repro`'s notebooks); a kernel still running a cell gets the
interrupt, and the cell's own clean-up runs."""

import asyncio
import os
import signal
import sys
import time

import pytest

from repro.child_signals import with_default_sigint
from repro.notebooks.kernel import QUIT_WAIT_S, ReproKernelManager


@pytest.fixture
def signals_sent(monkeypatch):
    """(time.monotonic(), pgid, signal) of every os.killpg call while the test runs: how jupyter_client signals a
    kernel's process group."""
    sent, real = [], os.killpg

    def record(pgid, sig):
        sent.append((time.monotonic(), pgid, signal.Signals(sig)))
        real(pgid, sig)

    monkeypatch.setattr(os, "killpg", record)
    return sent


def _manager(tmp_path) -> ReproKernelManager:
    return ReproKernelManager(kernel_name="python3", transport="ipc", ip=str(tmp_path / "kernel"))


async def _started(manager):
    await manager.start_kernel()
    client = manager.client()
    client.start_channels()
    await client.wait_for_ready(timeout=60)
    return client


def test_the_kernel_command_goes_through_the_launcher(tmp_path):
    manager = _manager(tmp_path)
    manager.kernel_spec  # noqa: B018  (loads the spec format_kernel_cmd reads)
    command = manager.format_kernel_cmd()
    assert command[:5] == with_default_sigint(["x"])[:5] and "ipykernel_launcher" in command
    assert command[5] == sys.executable  # the spec's `python`, replaced by this interpreter as jupyter_client does


def test_an_idle_kernel_is_asked_to_quit_and_never_interrupted(tmp_path, signals_sent):
    async def scenario():
        manager = _manager(tmp_path)
        client = await _started(manager)
        reply = await client.execute_interactive("x = 6 * 7", timeout=60)
        assert reply["content"]["status"] == "ok"
        pid = manager.provisioner.pid
        started = time.monotonic()
        await manager.shutdown_kernel()
        client.stop_channels()
        return pid, started

    pid, started = asyncio.run(scenario())
    # none, as a rule; ipykernel's exit now and then hangs joining its control thread (2 in 60 tries), and only a
    # kernel still there after QUIT_WAIT_S gets jupyter_client's signals (jupyter_client's own manager sends SIGINT
    # at once, every time)
    assert all(at - started >= QUIT_WAIT_S for at, group, _ in signals_sent if group == pid), signals_sent
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_kernel_busy_in_a_cell_is_interrupted_and_the_cell_cleans_up(tmp_path, signals_sent):
    marker = tmp_path / "cleaned"
    cell = (f"import time\ntry:\n    time.sleep(120)\nexcept KeyboardInterrupt:\n"
            f"    open({str(marker)!r}, 'w').write('interrupted')\n    raise")

    async def scenario():
        manager = _manager(tmp_path)
        client = await _started(manager)
        client.execute(cell)
        while (await client.get_iopub_msg(timeout=60))["msg_type"] != "execute_input":
            pass
        await asyncio.sleep(0.3)  # in time.sleep by now
        pid = manager.provisioner.pid
        started = time.monotonic()
        await manager.shutdown_kernel()
        client.stop_channels()
        return pid, time.monotonic() - started

    pid, seconds = asyncio.run(scenario())
    assert [sig for _, group, sig in signals_sent if group == pid][0] == signal.SIGINT
    assert marker.read_text() == "interrupted" and seconds < 10
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
