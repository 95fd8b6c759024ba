"""Shared fixtures: a real RabbitMQ vhost per test run, and units that stop themselves."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from harness.broker import create_vhost, delete_vhost, url_for_vhost
from qbroker import Config, Unit

MakeUnit = Callable[..., Awaitable[Unit]]

# What both test trees use (tests/qbroker, tests/services): the heavy marker by fixture (harness/pytest_plugin.py)
# and the provisioned deployment (harness/provisioned.py).
pytest_plugins = ["harness.pytest_plugin", "harness.provisioned"]


@pytest.fixture(scope="session")
def vhost() -> Iterator[str]:
    name = create_vhost()
    yield name
    delete_vhost(name)


@pytest.fixture(scope="session")
def amqp_url(vhost: str) -> str:
    return url_for_vhost(vhost)


@contextlib.asynccontextmanager
async def units_on(url: str, *, drain_timeout: float = 2.0) -> AsyncIterator[MakeUnit]:
    """A factory of units on ``url``; every unit it made is stopped (or killed) at exit."""
    units: list[Unit] = []

    async def factory(app: str = "test.unit", **overrides: Any) -> Unit:
        unit = Unit(app, config=Config(url=url, **overrides))
        units.append(unit)
        return unit

    try:
        yield factory
    finally:
        for unit in reversed(units):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(unit.stop(drain_timeout=drain_timeout), 10)
            with contextlib.suppress(Exception):
                await unit.kill()


@pytest.fixture
async def make_unit(amqp_url: str) -> AsyncIterator[MakeUnit]:
    async with units_on(amqp_url) as factory:
        yield factory
