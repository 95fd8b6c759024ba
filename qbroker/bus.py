"""The bus under a unit: one connection, the four exchanges, the reply queue, publishing and replies.

This is everything ``rpc``, ``alerts`` and ``dead_letter`` need of a unit (FastStream's broker config,
Nameko's publisher) and nothing more: make a message, publish it, send a reply, wait until connected,
the replies in flight, register a consumer. The ``Unit`` owns one and builds its endpoints and
listeners on top, so a request goes straight down: unit -> rpc -> bus -> envelope -> codecs.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import aio_pika
from aio_pika.abc import AbstractIncomingMessage
from structlog.typing import FilteringBoundLogger

from qbroker.codecs import CodecError
from qbroker.config import Config
from qbroker.connection import ConnectionSupervisor
from qbroker.envelope import MessageKind, build_message
from qbroker.errors import ConnectionLost, ErrorInfo, RequestError
from qbroker.exchanges import Exchanges, declare_exchanges, declare_unit_queue
from qbroker.replies import PendingReplies, parse_reply
from qbroker.transport import Channel, Connection, Consumer, Queue

Role = Literal["rpc", "reply", "alert", "dead"]
OnConnected = Callable[[Connection], Awaitable[None]]


class Bus:
    """One unit's connection to the broker and the operations on it that everything above shares."""

    def __init__(self, config: Config, *, app: str, uuid: str, log: FilteringBoundLogger,
                 on_connected: OnConnected) -> None:
        self.config = config
        self.app = app
        self.uuid = uuid
        self.log = log
        self.pending = PendingReplies()
        self.handler_observers: list[Callable[[str, str, str, float], None]] = []  # e.g. qbroker.metrics.instrument
        self.supervisor = ConnectionSupervisor(config, self._connected, self._lost, app=app, uuid=uuid)
        self._on_connected = on_connected
        self._exchanges: Exchanges | None = None
        self._consumers: list[tuple[Queue, str]] = []
        # Between start() and stop_consuming(): a channel the broker closes under us means "reconnect".
        self._serving = False

    # -- connection -----------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.supervisor.start()
        self._serving = True

    async def stop_consuming(self) -> None:
        """Cancel every consumer: no new work arrives, work in hand carries on (and may still reply)."""
        self._serving = False
        for queue, tag in self._consumers:
            with contextlib.suppress(Exception):
                await queue.cancel(tag)
        self._consumers.clear()

    async def close(self, reason: str) -> None:
        self._serving = False
        await self.supervisor.close()
        self.pending.fail_all(ConnectionLost(reason))

    @property
    def connection(self) -> Connection | None:
        return self.supervisor.connection

    async def wait_connected(self, timeout: float | None) -> bool:
        return await self.supervisor.wait_ready(timeout)

    async def _connected(self, connection: Connection) -> None:
        self._consumers = []
        publish_channel = await self.channel(connection, confirms=True)
        self._exchanges = await declare_exchanges(publish_channel, self.config)
        own = await self.channel(connection, confirms=False)
        reply_queue = await declare_unit_queue(own, self.config, "reply", self.uuid)
        await reply_queue.bind(self._exchanges.reply, routing_key=self.uuid)
        await reply_queue.consume(self._on_reply, no_ack=True)
        await self._on_connected(connection)

    async def _lost(self, exc: BaseException | None) -> None:
        self._exchanges = None
        self.pending.fail_all(ConnectionLost("connection to the broker was lost; the request may be retried"))

    async def channel(self, connection: Connection, *, confirms: bool) -> Channel:
        """A channel whose closing by the broker (e.g. a declare conflict) rebuilds the whole connection."""
        channel = await connection.channel(publisher_confirms=confirms)

        def _channel_closed(_: object, exc: BaseException | None = None) -> None:
            # A half-wired unit is worse than a reconnect: start over on a fresh connection.
            if exc is not None and self._serving and not connection.is_closed:
                self.log.warning("channel closed by broker; reconnecting", error=repr(exc))
                self.supervisor.lose(exc)

        channel.close_callbacks.add(_channel_closed)
        return channel

    async def add_consumer(self, queue: Queue, consumer: Consumer) -> None:
        """Consume ``queue`` until stop_consuming() (or the connection ends)."""
        self._consumers.append((queue, await queue.consume(consumer)))

    async def _on_reply(self, message: AbstractIncomingMessage) -> None:
        reply = parse_reply(message, accept=self.config.accept, max_bytes=self.config.max_body_bytes)
        if not self.pending.deliver(reply):
            self.log.debug("reply nobody waits for", correlation_id=message.correlation_id)

    # -- publishing ---------------------------------------------------------------------------------

    def make_message(self, body: Any, *, kind: MessageKind, message_id: str, **fields: Any) -> aio_pika.Message:
        return build_message(body, kind=kind, app_id=self.uuid, app=self.app, message_id=message_id, **fields)

    async def publish(self, role: Role, routing_key: str, message: aio_pika.Message) -> None:
        exchanges = self._exchanges
        if exchanges is None:
            raise ConnectionLost("not connected to a broker")
        await getattr(exchanges, role).publish(message, routing_key=routing_key, mandatory=False)

    async def send_reply(self, reply_to: str, correlation_id: str | None, body: Any, error: ErrorInfo | None,
                         *, debug: bool = False) -> None:
        """Publish one reply; never raises (a lost connection means the request is redelivered)."""
        try:
            try:
                message = self.make_message(body, kind="reply", message_id=uuid.uuid4().hex,
                                            correlation_id=correlation_id, error=error, debug=debug)
            except CodecError as exc:
                bad = RequestError("bad_result", f"handler result cannot be encoded: {exc}")
                message = self.make_message(None, kind="reply", message_id=uuid.uuid4().hex,
                                            correlation_id=correlation_id, error=bad.to_info())
            await self.publish("reply", reply_to, message)
        except Exception as exc:
            self.log.warning("reply not sent", correlation_id=correlation_id, error=str(exc) or type(exc).__name__)
