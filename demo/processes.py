"""The demo's service processes by name, and a watch that reports at once one that ends while the demo runs.

Each service's end is an event: the process's pidfd (Linux) becomes readable when it exits, so nothing polls
and nothing waits in a thread (a thread blocked in ``wait()`` would hold up the event loop's shutdown while
the service still runs). Where there are no pidfds, the processes are looked at twice a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

POLL_SECONDS = 0.5  # only without pidfds


@dataclass(frozen=True)
class Service:
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def name(self) -> str:
        """The program, as an operator finds it in ``ps``: ``toposm-renderer``."""
        return Path(str(self.process.args[0] if isinstance(self.process.args, list) else self.process.args)).name

    @property
    def pid(self) -> int:
        return self.process.pid

    def __str__(self) -> str:
        return f"{self.name} (pid {self.pid})"


def how_it_ended(returncode: int) -> str:
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
        return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


async def wait_exit(process: subprocess.Popen[bytes]) -> int:
    """The process's return code once it has ended (reaped here)."""
    if process.returncode is not None:
        return process.returncode
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # no pidfds here (not Linux 5.3+), or it has been reaped already
        while process.poll() is None:
            await asyncio.sleep(POLL_SECONDS)
        return process.wait()
    ended: asyncio.Future[None] = loop.create_future()

    def readable() -> None:  # once it has ended, and again on each turn until the reader is removed
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await ended
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return process.wait()


async def watch(services: list[Service], say: Callable[[str], None]) -> None:
    """Say at once when a service ends (how, and where its log is) and which still run; returns when none
    runs any more. The demo cancels it before it stops the services itself."""
    running = list(services)
    waits = {asyncio.ensure_future(wait_exit(service.process)): service for service in services}
    try:
        pending = set(waits)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                service = waits[task]
                running.remove(service)
                say(f"  ! {service} {how_it_ended(task.result())}; its log: {service.log}")
            say("  ! still running: " + (", ".join(map(str, running)) if running else "none of the services"))
    finally:
        for task in waits:
            task.cancel()
