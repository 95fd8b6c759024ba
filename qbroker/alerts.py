"""Alerts: broadcasts on the ``alert`` topic exchange, listeners by topic pattern, and gathering replies."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol

from aio_pika.abc import AbstractIncomingMessage

from qbroker.bus import Bus
from qbroker.context import RequestContext
from qbroker.envelope import JSON, debug_info, new_message_id, read_body, read_error, read_header
from qbroker.errors import QBrokerError
from qbroker.handlers import run_handler
from qbroker.middleware import ChainCache, Next, Outcome
from qbroker.original_dialect import for_original
from qbroker.replies import Reply


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


class Dispatch(Protocol):
    """What a listener runs: a ``Handler``, or an endpoint answering a broadcast (``qbroker.serving``)."""

    async def call(self, body: Any, ctx: RequestContext) -> Any: ...


@dataclass
class Listener:
    pattern: str
    handler: Dispatch
    chain: ChainCache = field(default_factory=ChainCache, repr=False, compare=False)  # its middleware chain

    def run(self, bus: Bus) -> Next:
        """This listener's handler inside the unit's middleware (no built-ins: they are a request's)."""
        cache = self.chain
        if cache.version == bus.middleware.version:
            return cache.chain
        return cache.set(bus.middleware, bus.middleware.build([], self._run))

    async def _run(self, ctx: RequestContext, body: Any) -> Outcome:
        return await run_handler(self.handler.call, ctx.part or self.pattern, None, ctx, body)


async def serve_alert(bus: Bus, listeners: list[Listener], message: AbstractIncomingMessage) -> None:
    """Run every listener whose pattern matches; reply per listener when the alert asks for replies."""
    name = message.routing_key or ""
    try:
        header = read_header(message)
        body = read_body(message, accept=bus.config.accept, max_bytes=bus.config.max_body_bytes)
        alert_error = read_error(message)
    except QBrokerError as exc:
        bus.log.warning("malformed alert", name=name, correlation_id=message.message_id, error=str(exc))
        refusal = exc.to_info(part=name)
        bus.middleware.tell_refused(name, "alert", refusal, bus.log)
        if message.reply_to:
            await bus.send_reply(
                message.reply_to, message.message_id, None, refusal, part=name, original=for_original(message.headers)
            )
        await message.ack()
        return
    original = for_original(message.headers) if header.reply_to else None
    for listener in listeners:
        if not topic_matches(listener.pattern, name):
            continue
        ctx = RequestContext(header=header, kind="alert", logger=bus.log, message=message, error=alert_error, part=name)
        result, error = await listener.run(bus)(ctx, body)
        if error is not None and error.status in ("error", "fail"):
            ctx.log.warning("alert listener failed", pattern=listener.pattern, error=error.message)
        if header.reply_to and (result is not None or error is not None):
            info = debug_info(bus.app, bus.uuid, name, listener=listener.pattern) if header.debug else None
            await bus.send_reply(
                header.reply_to,
                header.message_id,
                result,
                error,
                debug=header.debug,
                part=name,
                original=original,
                debug_info=info,
            )
    await message.ack()


async def gather(
    bus: Bus,
    name: str,
    body: Any,
    *,
    timeout: float,
    max_replies: int | None = None,
    gap: float | None = None,
    content_type: str = JSON,
) -> AsyncIterator[Reply]:
    """Broadcast ``name`` and yield replies until ``max_replies``, the deadline, or ``gap`` of silence."""
    with bus.middleware.sending("gather", name) as sending:
        replies = _gather(bus, name, body, timeout, max_replies, gap, content_type, sending.headers)
        async with contextlib.aclosing(replies):  # an early break closes the gather (and its hooks) at once
            async for reply in replies:
                yield reply


async def _gather(
    bus: Bus,
    name: str,
    body: Any,
    timeout: float,
    max_replies: int | None,
    gap: float | None,
    content_type: str,
    headers: dict[str, Any],
) -> AsyncGenerator[Reply, None]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    message_id = new_message_id()
    replies = bus.pending.open_gather(message_id)
    try:
        message = bus.make_message(
            body,
            kind="alert",
            name=name,
            message_id=message_id,
            reply_to=bus.uuid,
            content_type=content_type,
            extra_headers=headers,
        )
        await bus.publish("alert", name, message)
        count = 0
        while max_replies is None or count < max_replies:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            wait = min(remaining, gap) if gap is not None and count > 0 else remaining
            try:  # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel that meets a reply
                async with asyncio.timeout(wait):
                    reply = await replies.get()
            except TimeoutError:
                return
            if isinstance(reply, QBrokerError):
                bus.log.info("gather ended early", name=name, replies=count, reason=reply.message)
                return
            count += 1
            yield reply
    finally:
        bus.pending.close_gather(message_id)
