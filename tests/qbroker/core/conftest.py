"""The core suite runs twice: on the real RabbitMQ (a per-run vhost) and on the in-memory broker.

``make_unit`` is parametrized over the transport; a test or module marked ``rabbitmq_only`` (it needs a
real broker: a private node to restart, or a raw aio-pika client) gets the RabbitMQ run only.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from qbroker.testing import MemoryBroker
from tests.conftest import MakeUnit, units_on

TRANSPORTS = ("rabbitmq", "memory")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "transport" in metafunc.fixturenames:
        only_rabbitmq = metafunc.definition.get_closest_marker("rabbitmq_only") is not None
        metafunc.parametrize("transport", ["rabbitmq"] if only_rabbitmq else list(TRANSPORTS))


@pytest.fixture
async def make_unit(transport: str, request: pytest.FixtureRequest) -> AsyncIterator[MakeUnit]:
    if transport == "rabbitmq":
        url = request.getfixturevalue("amqp_url")  # only now: the memory run needs no RabbitMQ
    else:
        memory_name = f"core-{uuid.uuid4().hex[:12]}"  # a fresh broker per test: isolation without cleanup
        url = f"memory://{memory_name}"
    # Teardown only: handlers still sleeping (e.g. a deliberately slow responder) are abandoned sooner in
    # memory, where nothing is left behind on a shared broker anyway.
    async with units_on(url, drain_timeout=2.0 if transport == "rabbitmq" else 0.2) as factory:
        yield factory
    if transport == "memory":
        MemoryBroker.discard(memory_name)
