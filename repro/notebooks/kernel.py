"""The kernel manager papermill starts each notebook's kernel with (``execute_notebook``).

jupyter_client's own ``AsyncKernelManager`` with two changes:

- the kernel starts with SIGINT at its default, whatever the chain inherited (``nohup make repro &`` starts it
  ignored): the kernel's command goes through :func:`repro.child_signals.with_default_sigint`. ipykernel sets its own
  SIGINT handling once it runs; what it starts before that, and any other kernel, inherits the default.
- a graceful shutdown asks the kernel to quit before interrupting it. jupyter_client sends SIGINT to the kernel's
  process group first, always. papermill's last request (``kernel_info``, after the last cell) is answered from
  inside ipykernel's message handler, where ipykernel has SIGINT raise KeyboardInterrupt, and papermill shuts the
  kernel down as soon as the answer arrives: the SIGINT then lands in that handler now and then, and ipykernel logs
  ``[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel.`` on our terminal (9 of 70 runs of the chain's
  notebooks 10-20 here with jupyter_client's manager, 0 of 40 with this one). An idle kernel quits on the request
  alone; one still running a cell (a chain stopped with Ctrl-C) does not, and after :data:`QUIT_WAIT_S` gets
  jupyter_client's whole sequence: the interrupt, which lets the cell's clean-up run, then SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import asyncio
import time

from jupyter_client.manager import AsyncKernelManager

from repro.child_signals import with_default_sigint

# An idle ipykernel 7.4 quit 0.07-0.70 s after the request in 58 of 60 tries (2 cores, load 4.7). The other 2 never
# quit: ipykernel's exit can hang joining its control thread (an upstream race), and jupyter_client's SIGTERM ends
# those, as it did before.
QUIT_WAIT_S = 2.0


class ReproKernelManager(AsyncKernelManager):
    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        return with_default_sigint(super().format_kernel_cmd(extra_arguments))

    async def shutdown_kernel(self, now: bool = False, restart: bool = False) -> None:
        if self.has_kernel and not now and not restart:
            await self.request_shutdown()
            deadline = time.monotonic() + QUIT_WAIT_S
            while await self.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if not await self.is_alive():
                await self.provisioner.wait()  # reaped: the steps below find no process left to signal
        await super().shutdown_kernel(now=now, restart=restart)
