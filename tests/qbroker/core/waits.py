"""Waiting on the broker's state instead of the clock, on either transport."""

from __future__ import annotations

import asyncio
from urllib.parse import unquote, urlsplit

from harness import HANG, eventually
from harness.broker import list_queues
from qbroker import Unit
from qbroker.testing import broker_of


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
    async def there() -> bool:
        return await ready_messages(unit, queue) == count

    await eventually(there, timeout, 0.02)


async def queue_exists(unit: Unit, queue: str) -> bool:
    """Without touching the queue: a passive declare would renew its x-expires lease."""
    if unit.config.urls[0].startswith("memory://"):
        return queue in broker_of(unit.config).queues
    vhost = unquote(urlsplit(unit.config.urls[0]).path.lstrip("/")) or "/"
    return queue in await asyncio.to_thread(list_queues, vhost)


async def until_queue_gone(unit: Unit, queue: str, timeout: float = HANG) -> None:
    async def gone() -> bool:
        return not await queue_exists(unit, queue)

    await eventually(gone, timeout)
