"""Shared fixtures: a real RabbitMQ vhost per test run, and units that stop themselves."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from qbroker import Config, Unit
from tests.broker import create_vhost, delete_vhost, url_for_vhost

MakeUnit = Callable[..., Awaitable[Unit]]


@pytest.fixture(scope="session")
def vhost() -> Iterator[str]:
    name = create_vhost()
    yield name
    delete_vhost(name)


@pytest.fixture(scope="session")
def amqp_url(vhost: str) -> str:
    return url_for_vhost(vhost)


@pytest.fixture
async def make_unit(amqp_url: str) -> AsyncIterator[MakeUnit]:
    units: list[Unit] = []

    async def factory(app: str = "test.unit", **overrides: Any) -> Unit:
        unit = Unit(app, config=Config(url=amqp_url, **overrides))
        units.append(unit)
        return unit

    yield factory
    for unit in reversed(units):
        with contextlib.suppress(Exception):
            await asyncio.wait_for(unit.stop(drain_timeout=2), 10)
        with contextlib.suppress(Exception):
            await unit.kill()
