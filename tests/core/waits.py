"""Waiting on the broker's state instead of the clock, on either transport."""

from __future__ import annotations

import asyncio
import time

from qbroker import Unit
from qbroker.testing import broker_of

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
