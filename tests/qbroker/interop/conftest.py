"""The original QBroker (trio_qbroker) on the same bus as qbroker: its own code, in its own venv.

``peer_python`` builds the original's environment once (harness/original_qbroker.py) and skips only when the
package index is unreachable. ``original`` starts units of the original (tests/qbroker/interop/original_agent.py, run
by that venv's Python) on the test's vhost and drives them over stdin/stdout; they stop at the test's end.

Until qbroker declares the exchanges passively beside the original's (they differ: the original declares
``dead`` as a topic exchange, ``alert`` without an alternate exchange), a vhost's exchanges must be qbroker's:
every test starts a qbroker unit before the original's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import orjson
import pytest

from harness import HANG
from harness.broker import create_vhost, delete_vhost, url_for_vhost
from harness.original_qbroker import IndexUnreachable, PeerSetupError, ensure_peer_python, original_source
from harness.pytest_plugin import heavy
from tests.conftest import MakeUnit, units_on

AGENT = Path(__file__).with_name("original_agent.py")


@pytest.fixture(scope="session")
@heavy("builds the original QBroker's venv and runs its units")
def peer_python() -> Path:
    try:
        return ensure_peer_python()
    except IndexUnreachable as exc:
        pytest.skip(str(exc))
    except PeerSetupError as exc:
        pytest.fail(str(exc))


@pytest.fixture
def fresh_vhost() -> Iterator[str]:
    """A vhost of the test's own: the order in which each side declared its exchanges matters here."""
    name = create_vhost("qbroker-interop")
    yield name
    delete_vhost(name)


@pytest.fixture
def fresh_url(fresh_vhost: str) -> str:
    return url_for_vhost(fresh_vhost)


@pytest.fixture
async def qbroker_units(fresh_url: str) -> AsyncIterator[MakeUnit]:
    async with units_on(fresh_url) as factory:
        yield factory


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"$bytes"}:
            return bytes.fromhex(value["$bytes"])
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _encode(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$bytes": value.hex()}
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    return value


class OriginalUnit:
    """One unit of the original QBroker in a process of its own, driven by JSON lines."""

    def __init__(self, proc: asyncio.subprocess.Process, stderr: Path) -> None:
        self.proc = proc
        self.stderr = stderr
        self.uuid = ""
        self.app = ""
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._answers: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._ready: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            try:
                message = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if "ready" in message and not self._ready.done():
                self._ready.set_result(message)
            elif "event" in message:
                self.events.put_nowait(_decode(message))
            elif message.get("id") in self._answers:
                self._answers.pop(message["id"]).set_result(message)
        for future in [self._ready, *self._answers.values()]:
            if not future.done():
                future.set_exception(AssertionError(f"the original unit ended:\n{self.log_tail()}"))

    def log_tail(self, lines: int = 60) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.stderr.read_text(errors="replace").splitlines()[-lines:])
        return ""

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None and not self._reader.done()

    async def wait_ready(self) -> None:
        ready = await asyncio.wait_for(self._ready, HANG)
        self.uuid, self.app = ready["uuid"], ready["app"]

    async def command(self, op: str, **fields: Any) -> dict[str, Any]:
        """Run one command in the original unit; its answer (``ok``, ``error``, ``timeout``, ``replies``)."""
        number = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._answers[number] = future
        assert self.proc.stdin is not None
        self.proc.stdin.write(orjson.dumps({"op": op, "id": number, **_encode(fields)}) + b"\n")
        await self.proc.stdin.drain()
        return _decode(await asyncio.wait_for(future, HANG))  # type: ignore[no-any-return]

    async def rpc(self, name: str, data: Any = None, **options: Any) -> dict[str, Any]:
        return await self.command("rpc", name=name, data=data, **options)

    async def next_event(self, **match: Any) -> dict[str, Any]:
        async with asyncio.timeout(HANG):
            while True:
                event = await self.events.get()
                if all(event.get(k) == v for k, v in match.items()):
                    return event

    async def stop(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(Exception):
                assert self.proc.stdin is not None
                self.proc.stdin.write(b'{"op": "quit"}\n')
                await self.proc.stdin.drain()
            try:
                await asyncio.wait_for(self.proc.wait(), 15)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        self._reader.cancel()


StartOriginal = Callable[..., Awaitable[OriginalUnit]]


def original_settings(url: str, app: str, **options: Any) -> dict[str, Any]:
    parts = urlsplit(url)
    return {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 5672,
        "login": unquote(parts.username or ""),
        "password": unquote(parts.password or ""),
        "vhost": unquote(parts.path[1:]),
        "app": app,
        **options,
    }


def original_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(original_source()), "PYTHONWARNINGS": "ignore"}


@pytest.fixture
async def original(peer_python: Path, fresh_url: str, tmp_path: Path) -> AsyncIterator[StartOriginal]:
    """``await original("orig.app", serve=True, dead=True, debug=True)``: a started unit of the original on the
    test's vhost (``dead``: it runs its own dead-letter collector; ``debug``: its handlers answer errors to
    requests with ``debug``)."""
    started: list[OriginalUnit] = []

    async def start(app: str, **options: Any) -> OriginalUnit:
        stderr = tmp_path / f"original-{len(started)}.log"
        with open(stderr, "wb") as err:
            proc = await asyncio.create_subprocess_exec(
                str(peer_python),
                str(AGENT),
                orjson.dumps(original_settings(fresh_url, app, **options)).decode(),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                env=original_env(),
            )
        unit = OriginalUnit(proc, stderr)
        started.append(unit)
        await unit.wait_ready()
        return unit

    try:
        yield start
    finally:
        for unit in reversed(started):
            await unit.stop()
