"""Integration harness: the queuemaster and renderers as real subprocesses on a vhost of their own.

Each test gets a fresh vhost, because ``toposm.queuemaster`` is one shared endpoint name: a queuemaster
left over from another test must never answer this test's requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from harness import eventually
from harness.broker import create_vhost, delete_vhost, url_for_vhost
from qbroker import Config, Unit

BIN = Path(sys.executable).parent


class Proc:
    """A service subprocess in its own process group (its render workers die with it)."""

    def __init__(self, args: list[str], url: str, log: Path) -> None:
        self.log = log
        env = {**os.environ, "QBROKER_URL": url}
        self._out = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(args, env=env, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def kill(self) -> None:
        """SIGKILL the whole group: no unregister, no cleanup, like a crash."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(10)

    def stop(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(8)
            except subprocess.TimeoutExpired:
                self.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # leftover render workers
        self._out.close()


class TileBus:
    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.tmp = tmp
        self.tile_root = tmp / "tiles"
        self.state_file = tmp / "queue.sqlite"
        self.render_log = tmp / "render.log"
        self.procs: list[Proc] = []
        self.units: list[Unit] = []

    def queuemaster(self, *extra: str) -> Proc:
        args = [
            str(BIN / "toposm-queuemaster"),
            "--tile-root",
            str(self.tile_root),
            "--state-file",
            str(self.state_file),
            "--render-log",
            str(self.render_log),
            "--max-zoom",
            "18",
            "--ping-interval",
            "0.5",
            *extra,
        ]
        proc = Proc(args, self.url, self.tmp / "queuemaster.log")
        self.procs.append(proc)
        return proc

    def renderer(self, *extra: str, threads: int = 1, backend: str = "testpattern") -> Proc:
        args = [
            str(BIN / "toposm-renderer"),
            "--threads",
            str(threads),
            "--backend",
            backend,
            "--tile-root",
            str(self.tile_root),
            *extra,
        ]
        proc = Proc(args, self.url, self.tmp / f"renderer-{len(self.procs)}.log")
        self.procs.append(proc)
        return proc

    async def client(self) -> Unit:
        unit = Unit("test.tiles.client", config=Config(url=self.url))
        await unit.start()
        self.units.append(unit)
        return unit

    def render_log_lines(self) -> list[dict[str, Any]]:
        import json

        if not self.render_log.exists():
            return []
        return [json.loads(line) for line in self.render_log.read_text().splitlines()]

    def logs(self) -> str:
        return "\n".join(f"--- {p.log.name}\n{p.log.read_text()[-3000:]}" for p in self.procs if p.log.exists())


async def stats(unit: Unit) -> dict[str, Any]:
    result: dict[str, Any] = await unit.call("toposm.queuemaster", {"command": "stats"}, timeout=5)
    return result


async def wait_renderers(unit: Unit, n: int, timeout: float = 30.0) -> dict[str, Any]:
    async def ready() -> dict[str, Any] | None:
        s = await stats(unit)
        return s if len(s["renderers"]) == n else None

    result: dict[str, Any] = await eventually(ready, timeout)
    return result


async def render_in_progress(client: Unit, tile: str, timeout: float = 60) -> asyncio.Task[Any]:
    """Request ``tile`` and return the pending request once the (only) render thread has it in hand.

    The renderer's own word (its thread's ``ping``), not the queuemaster's: the queuemaster says
    ``rendering`` as soon as it sends ``render``, before the renderer has taken it; a SIGTERM in between
    has the renderer refuse it as new work (``stopping``), and it was never in hand."""
    request = asyncio.create_task(
        client.call("toposm.queuemaster", {"command": "render", "tile": tile}, timeout=timeout)
    )

    async def rendering() -> bool:
        [thread] = (await stats(client))["renderers"]
        if thread["state"] != "rendering":
            return False
        pong = await client.call(thread["renderer"], {"command": "ping"}, timeout=5)
        return bool(pong["state"] == "rendering")

    await eventually(rendering)
    return request


@pytest.fixture
async def bus(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[TileBus]:
    vhost = create_vhost("qbroker-tiles")
    tb = TileBus(url_for_vhost(vhost), tmp_path)
    try:
        yield tb
    finally:
        if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
            print(tb.logs())
        for unit in tb.units:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(unit.stop(drain_timeout=1), 5)
        for proc in reversed(tb.procs):
            proc.stop()
        delete_vhost(vhost)


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


async def alert_listener(tb: TileBus, name: str) -> list[Any]:
    """Bodies heard on qbroker's ``alert`` exchange under ``name`` (a unit stopped with the bus)."""
    heard: list[Any] = []
    listener = Unit(f"test.listener.{name}", config=Config(url=tb.url))

    @listener.on_alert(name)
    async def on_alert(body: Any) -> None:
        heard.append(body)

    await listener.start()
    tb.units.append(listener)
    return heard
