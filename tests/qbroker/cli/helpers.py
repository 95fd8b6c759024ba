"""Running the real console scripts as subprocesses, without blocking the test's event loop.

The example unit lives in the test's own event loop, so a blocking ``subprocess.run`` would stop it
from answering; everything here is asyncio.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

BIN = Path(sys.executable).parent
QBROKER = str(BIN / "qbroker")
QBROKER_DEBUG = str(BIN / "qbroker-debug")


def cli_env(url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QBROKER_")}
    env.update(QBROKER_URL=url, COLUMNS="200", **extra)
    return env


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return orjson.loads(self.stdout)


async def run_cli(
    url: str, *args: str, stdin: str | None = None, timeout: float = 30.0, exe: str = QBROKER, **env: str
) -> Result:
    proc = await asyncio.create_subprocess_exec(
        exe,
        *args,
        env=cli_env(url, **env),
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin is not None else None), timeout)
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


class Snooper:
    """A running ``qbroker-debug`` whose output lines are read as they come."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.stderr_lines: list[str] = []
        self.lines: list[str] = []

    @classmethod
    async def start(cls, url: str, *args: str) -> Snooper:
        proc = await asyncio.create_subprocess_exec(
            QBROKER_DEBUG,
            *args,
            env=cli_env(url),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        snooper = cls(proc)
        await snooper.wait_ready()
        return snooper

    async def wait_ready(self, timeout: float = 20.0) -> str:
        return await self.wait_stderr("watching", timeout)

    async def wait_stderr(self, text: str, timeout: float = 20.0) -> str:
        """The next status line on stderr containing ``text``."""
        assert self.proc.stderr is not None
        async with asyncio.timeout(timeout):
            while True:
                line = (await self.proc.stderr.readline()).decode()
                if not line:
                    raise AssertionError(f"qbroker-debug exited early: {self.stderr_lines}")
                self.stderr_lines.append(line)
                if text in line:
                    return line

    async def next_line(self, timeout: float = 10.0) -> str:
        assert self.proc.stdout is not None
        line = (await asyncio.wait_for(self.proc.stdout.readline(), timeout)).decode()
        if not line:
            raise AssertionError("qbroker-debug closed its output")
        self.lines.append(line)
        return line

    async def next_event(self, timeout: float = 10.0, **match: Any) -> dict[str, Any]:
        """The next JSON event whose fields equal ``match`` (others are skipped)."""
        async with asyncio.timeout(timeout):
            while True:
                event = orjson.loads(await self.next_line(timeout))
                if all(event.get(k) == v for k, v in match.items()):
                    return event  # type: ignore[no-any-return]

    async def stop(self, sig: int = signal.SIGINT, timeout: float = 15.0) -> tuple[int, str, str]:
        """Signal it, then collect the rest of its output and its exit code."""
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        out, err = await asyncio.wait_for(self.proc.communicate(), timeout)
        rest = out.decode()
        self.lines.extend(rest.splitlines(keepends=True))
        self.stderr_lines.extend(err.decode().splitlines(keepends=True))
        assert self.proc.returncode is not None
        return self.proc.returncode, rest, err.decode()
