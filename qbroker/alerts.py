"""Alerts: broadcasts on the ``alert`` topic exchange, listeners by topic pattern, and gathering replies."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from aio_pika.abc import AbstractIncomingMessage

from qbroker.context import RequestContext
from qbroker.envelope import JSON, read_body, read_header
from qbroker.errors import QBrokerError
from qbroker.handlers import Handler
from qbroker.replies import Reply
from qbroker.rpc import run_handler

if TYPE_CHECKING:
    from qbroker.unit import Unit


@lru_cache(maxsize=4096)
def topic_matches(pattern: str, routing_key: str) -> bool:
    """AMQP topic semantics: '*' is exactly one word, '#' zero or more words."""
    return _match(tuple(pattern.split(".")), tuple(routing_key.split(".")))


def _match(pattern: tuple[str, ...], words: tuple[str, ...]) -> bool:
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(_match(rest, words[i:]) for i in range(len(words) + 1))
    if not words:
        return False
    return (head == "*" or head == words[0]) and _match(rest, words[1:])


@dataclass
class Listener:
    pattern: str
    handler: Handler


async def serve_alert(unit: Unit, listeners: list[Listener], message: AbstractIncomingMessage) -> None:
    """Run every listener whose pattern matches; reply per listener when the alert asks for replies."""
    name = message.routing_key or ""
    try:
        header = read_header(message)
        body = read_body(message, accept=unit.config.accept, max_bytes=unit.config.max_body_bytes)
    except QBrokerError as exc:
        unit.log.warning("malformed alert", name=name, correlation_id=message.message_id, error=str(exc))
        if message.reply_to:
            await unit.send_reply(message.reply_to, message.message_id, None, exc.to_info(part=name))
        await message.ack()
        return
    for listener in listeners:
        if not topic_matches(listener.pattern, name):
            continue
        ctx = RequestContext(header=header, kind="alert", logger=unit.log)
        result, error = await run_handler(unit, listener.handler.call, body, ctx, name, None)
        if error is not None and error.status in ("error", "fail"):
            ctx.log.warning("alert listener failed", pattern=listener.pattern, error=error.message)
        if header.reply_to and (result is not None or error is not None):
            await unit.send_reply(header.reply_to, header.message_id, result, error, debug=header.debug)
    await message.ack()


async def gather(unit: Unit, name: str, body: Any, *, timeout: float, max_replies: int | None = None,
                 gap: float | None = None, content_type: str = JSON) -> AsyncIterator[Reply]:
    """Broadcast ``name`` and yield replies until ``max_replies``, the deadline, or ``gap`` of silence."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    message_id = uuid.uuid4().hex
    replies = unit.pending.open_gather(message_id)
    try:
        message = unit.make_message(body, kind="alert", name=name, message_id=message_id,
                                    reply_to=unit.uuid, content_type=content_type)
        await unit.publish("alert", name, message)
        count = 0
        while max_replies is None or count < max_replies:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            wait = min(remaining, gap) if gap is not None and count > 0 else remaining
            try:
                reply = await asyncio.wait_for(replies.get(), wait)
            except TimeoutError:
                return
            count += 1
            yield reply
    finally:
        unit.pending.close_gather(message_id)

