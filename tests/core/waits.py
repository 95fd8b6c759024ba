"""Waiting on the broker's state instead of the clock, on either transport."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from urllib.parse import unquote, urlsplit

from qbroker import Unit
from qbroker.testing import broker_of
from tests.broker import list_queues

HANG = 60.0  # ceilings that only catch hangs


async def ready_messages(unit: Unit, queue: str) -> int:
    """Messages waiting in ``queue`` for a consumer (RabbitMQ's passive declare, or the memory broker)."""
    if unit.config.urls[0].startswith("memory://"):
        return broker_of(unit.config).message_count(queue)
    connection = unit.connection
    assert connection is not None, "unit not connected"
    channel = await connection.channel()
    try:
        declared = await channel.declare_queue(queue, passive=True)
        return int(declared.declaration_result.message_count)  # type: ignore[attr-defined]
    finally:
        await channel.close()


async def until_ready_messages(unit: Unit, queue: str, count: int, timeout: float = HANG) -> None:
    deadline = time.monotonic() + timeout
    while (waiting := await ready_messages(unit, queue)) != count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{queue}: {waiting} message(s) waiting, expected {count}, after {timeout}s")
        await asyncio.sleep(0.02)


async def queue_exists(unit: Unit, queue: str) -> bool:
    """Without touching the queue: a passive declare would renew its x-expires lease."""
    if unit.config.urls[0].startswith("memory://"):
        return queue in broker_of(unit.config).queues
    vhost = unquote(urlsplit(unit.config.urls[0]).path.lstrip("/")) or "/"
    return queue in await asyncio.to_thread(list_queues, vhost)


async def until_queue_gone(unit: Unit, queue: str, timeout: float = HANG) -> None:
    deadline = time.monotonic() + timeout
    while await queue_exists(unit, queue):
        if time.monotonic() > deadline:
            raise AssertionError(f"{queue} still exists after {timeout}s")
        await asyncio.sleep(0.05)


async def until(predicate: Callable[[], bool], what: str, timeout: float = HANG) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout}s")
        await asyncio.sleep(0.02)
