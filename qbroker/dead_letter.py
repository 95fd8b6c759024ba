"""The dead-letter collector: answers dead RPC requests at once, logs dead alerts, counts both.

Requests reach the ``dead`` queue two ways: the ``rpc`` exchange's alternate exchange (no queue bound
for the name: nobody serves it) and the ``rpc_<name>`` queues' dead-letter exchange (the request's
expiration passed while it waited, or a server rejected it). The caller gets a reply either way, so a
call to a missing service fails in milliseconds instead of at its deadline.

Run inside any unit with ``Config(dead_letters=True)``, or standalone: ``qbroker-dead-letter``
(``python -m qbroker.cli.dead_letter``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from aio_pika.abc import AbstractIncomingMessage

from qbroker.bus import Bus
from qbroker.errors import NoServer, QBrokerError, RequestError, RequestFailed, TimedOutInQueue
from qbroker.exchanges import declare_dead_queue
from qbroker.transport import Connection

PART = "qbroker.dead_letter"


def death_reason(message: AbstractIncomingMessage) -> str:
    """``unroutable`` (alternate exchange), or the broker's x-death reason: expired, rejected, maxlen."""
    deaths = (message.headers or {}).get("x-death")
    if not deaths or not isinstance(deaths, list | tuple):
        return "unroutable"
    reason = deaths[0].get("reason", "unknown") if isinstance(deaths[0], dict) else "unknown"
    return reason.decode() if isinstance(reason, bytes) else str(reason)


def error_for(name: str, reason: str) -> QBrokerError:
    if reason == "unroutable":
        return NoServer(f"no server for {name}")
    if reason == "expired":
        return TimedOutInQueue(f"request {name} timed out waiting in its queue")
    if reason == "rejected":
        return RequestFailed("rejected", f"request {name} was rejected by its server")
    return RequestError("dead_letter", f"request {name} was dead-lettered ({reason})")


class DeadLetterCollector:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.counts: Counter[str] = Counter()
        self.log = bus.log.bind(part=PART)

    async def attach(self, connection: Connection) -> None:
        channel = await self.bus.channel(connection, confirms=False)
        await channel.set_qos(prefetch_count=256)
        queue = await declare_dead_queue(channel, self.bus.config)
        await self.bus.add_consumer(queue, self._on_dead)

    async def _on_dead(self, message: AbstractIncomingMessage) -> None:
        kind = message.type or "unknown"
        reason = death_reason(message)
        raw_name = (message.headers or {}).get("name")
        name = raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name or message.routing_key or "?")
        self.counts[f"{kind}.{reason}"] += 1
        log = self.log.bind(name=name, correlation_id=message.message_id, reason=reason, kind=kind)
        if kind == "rpc" and message.reply_to and message.message_id:
            error = error_for(name, reason)
            await self.bus.send_reply(message.reply_to, message.message_id, None, error.to_info(part=PART))
            log.info("answered dead request", status=error.status, error=error.id)
        elif kind == "alert":
            log.debug("alert nobody listens to") if reason == "unroutable" else log.info("dead alert")
        else:
            log.info("dead message")
        await message.ack()

    def stats(self) -> dict[str, Any]:
        return dict(sorted(self.counts.items()))

