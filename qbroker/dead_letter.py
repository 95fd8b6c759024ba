"""The dead-letter collector: answers dead RPC requests at once, logs dead alerts, counts both.

Requests reach the ``dead`` queue two ways: the ``rpc`` exchange's alternate exchange (no queue bound
for the name: nobody serves it) and the ``rpc_<name>`` queues' dead-letter exchange (the request's
expiration passed while it waited, or a server rejected it). The caller gets a reply either way, so a
call to a missing service fails in milliseconds instead of at its deadline.

Run inside any unit with ``Config(dead_letters=True)``, or standalone: ``python -m qbroker.dead_letter``.
"""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from typing import TYPE_CHECKING, Any

from aio_pika.abc import AbstractConnection, AbstractIncomingMessage

from qbroker.errors import NoServer, QBrokerError, RequestError, RequestFailed, TimedOutInQueue
from qbroker.exchanges import declare_dead_queue

if TYPE_CHECKING:
    from qbroker.unit import Unit

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
    def __init__(self, unit: Unit) -> None:
        self.unit = unit
        self.counts: Counter[str] = Counter()
        self.log = unit.log.bind(part=PART)

    async def attach(self, connection: AbstractConnection) -> None:
        channel = await connection.channel(publisher_confirms=False)
        await channel.set_qos(prefetch_count=256)
        queue = await declare_dead_queue(channel, self.unit.config)
        self.unit._consumers.append((queue, await queue.consume(self._on_dead)))

    async def _on_dead(self, message: AbstractIncomingMessage) -> None:
        kind = message.type or "unknown"
        reason = death_reason(message)
        raw_name = (message.headers or {}).get("name")
        name = raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name or message.routing_key or "?")
        self.counts[f"{kind}.{reason}"] += 1
        log = self.log.bind(name=name, correlation_id=message.message_id, reason=reason, kind=kind)
        if kind == "rpc" and message.reply_to and message.message_id:
            error = error_for(name, reason)
            await self.unit.send_reply(message.reply_to, message.message_id, None, error.to_info(part=PART))
            log.info("answered dead request", status=error.status, error=error.id)
        elif kind == "alert":
            log.debug("alert nobody listens to") if reason == "unroutable" else log.info("dead alert")
        else:
            log.info("dead message")
        await message.ack()

    def stats(self) -> dict[str, Any]:
        return dict(sorted(self.counts.items()))


async def run_standalone() -> None:
    from qbroker.log import configure_logging
    from qbroker.unit import Unit

    configure_logging()
    unit = Unit("qbroker.dead_letter", dead_letters=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await unit.start()
    try:
        await stop.wait()
    finally:
        await unit.stop()


def main() -> None:
    try:
        asyncio.run(run_standalone())
    except QBrokerError as exc:
        raise SystemExit(f"qbroker-dead-letter: {exc}") from None


if __name__ == "__main__":
    main()
