"""Helpers for testing services built on qbroker; see docs/testing.md.

async def test_echo():
    config = memory_config()
    server, client = Unit("svc", config=config), Unit("client", config=config)
    ...register handlers on server...
    async with running(server, client):
        assert await client.call("svc.echo", {"text": "hi"}) == "hi"
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from qbroker.config import Config
from qbroker.testing.clock import ManualClock
from qbroker.testing.memory import SCHEME, MemoryBroker, connect
from qbroker.transport import register_transport

if TYPE_CHECKING:
    from qbroker.unit import Unit

__all__ = ["ManualClock", "MemoryBroker", "broker_of", "eventually", "memory_config", "running"]

# Importing the testing package is what makes ``memory://`` URLs work; production never imports it.
register_transport(SCHEME, connect)


def memory_config(name: str | None = None, **overrides: Any) -> Config:
    """A Config on an in-memory broker: a fresh one unless ``name`` names one already in use.

    Units built with the same config (or the same name) talk to each other; units on different
    brokers never see each other, so tests stay isolated without any cleanup.
    """
    broker = name or f"test-{uuid.uuid4().hex[:12]}"
    return Config(url=f"memory://{broker}", **overrides)


def broker_of(config: Config) -> MemoryBroker:
    """The in-memory broker a config points at (its first URL), for inspection and fault injection."""
    return MemoryBroker.for_url(config.urls[0])


@contextlib.asynccontextmanager
async def running(*units: Unit, drain_timeout: float = 2.0) -> AsyncIterator[tuple[Unit, ...]]:
    """Start ``units`` in order; at exit stop them in reverse order (draining), even if the body failed.

    If a unit fails to start, the ones already started are stopped before the error propagates.
    """
    started: list[Unit] = []
    try:
        for unit in units:
            await unit.start()
            started.append(unit)
        yield units
    finally:
        for unit in reversed(started):
            try:
                await unit.stop(drain_timeout=drain_timeout)
            except Exception:
                await unit.kill()


async def eventually(
    predicate: Callable[[], Any],
    timeout: float = 5.0,
    interval: float = 0.01,
    *,
    ignore: tuple[type[BaseException], ...] = (),
) -> Any:
    """Wait until ``predicate()`` is true (for effects of casts and alerts, which nobody answers) and
    return what it returned. ``predicate`` may be a coroutine function; an exception in ``ignore`` (say,
    a service not up yet) counts as not yet.

    Raises AssertionError after ``timeout`` seconds, so it reads as a failed assertion in test output.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = predicate()
            if inspect.isawaitable(last):
                last = await last
        except ignore as exc:
            last = exc
        if last and not isinstance(last, BaseException):
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout}s; last: {last!r}")
        await asyncio.sleep(interval)
