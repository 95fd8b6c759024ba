"""A bus's publishing channels: one with publisher confirms, one without for replies, reopened alone when the
broker closes one (a refused publish) so that consumers and the calls in flight carry on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Literal

from aiormq.exceptions import ChannelAccessRefused, DeliveryError
from structlog.typing import FilteringBoundLogger

from qbroker.config import Config
from qbroker.connection import ConnectionSupervisor
from qbroker.envelope import OutgoingMessage
from qbroker.errors import ConnectionLost, RequestFailed
from qbroker.exchanges import Exchanges, open_exchanges
from qbroker.transport import Channel, Connection, Exchange

Role = Literal["rpc", "reply", "alert", "dead"]


class PublishChannels:
    """The exchanges a ``Bus`` publishes to, on the channels it publishes on, while connected."""

    def __init__(
        self, config: Config, log: FilteringBoundLogger, supervisor: ConnectionSupervisor, serving: Callable[[], bool]
    ) -> None:
        self.config = config
        self.log = log
        self.supervisor = supervisor
        self._serving = serving  # the bus's: between start() and stop_consuming(), a closed channel is reopened
        self.exchanges: Exchanges | None = None
        self.unconfirmed_reply: Exchange | None = None  # the reply exchange on a channel without confirms
        self.channel: Channel | None = None  # the channel with confirms that ``exchanges`` are on
        self._channels: tuple[Channel, ...] = ()  # it and the one without confirms, for replies
        self.reopening: asyncio.Future[None] | None = None

    async def open(self, connection: Connection, channel: Channel | None = None) -> Exchanges:
        """The publishing channels: one with publisher confirms for requests, alerts and copies, and one
        without for replies (see ``Bus.send_reply``). The broker closes a channel when it refuses one publish
        (a message over its max_message_size, a forged user-id): then only these two are reopened, so
        consumers and the calls in flight carry on; only publishes unconfirmed at that moment fail."""
        if channel is None:
            channel = await connection.channel(publisher_confirms=True)
        exchanges = await open_exchanges(channel, self.config)
        replies = await connection.channel(publisher_confirms=False)
        self.unconfirmed_reply = await replies.get_exchange(exchanges.reply.name, ensure=False)
        self.channel = channel
        self._channels = (channel, replies)

        def _closed(_: object, exc: BaseException | None = None) -> None:
            if exc is None or not self._serving() or connection.is_closed or self.exchanges is not exchanges:
                return
            self.log.warning("publish channel closed by broker; reopening it", error=repr(exc))
            self._replace(connection)

        channel.close_callbacks.add(_closed)
        replies.close_callbacks.add(_closed)
        return exchanges

    def _replace(self, connection: Connection) -> None:
        self.exchanges = self.unconfirmed_reply = self.channel = None
        for channel in self._channels:
            if not channel.is_closed:
                asyncio.ensure_future(_quietly(channel.close()))
        self.reopening = asyncio.ensure_future(self._reopen(connection))

    def refused(self, channel: Channel | None, exc: BaseException) -> None:
        """The broker nacked a publish on ``channel``. RabbitMQ (3.10) goes on nacking every publish to a quorum
        queue on a channel whose publishes to it were refused while the queue had no leader (a node died), and
        accepts a fresh channel's at once: so the publishing channels are replaced, as after a refusal."""
        connection = self.supervisor.connection
        if channel is None or channel is not self.channel or connection is None or connection.is_closed:
            return
        self.log.warning("publish refused by the broker; opening fresh publish channels", error=repr(exc))
        self._replace(connection)

    async def _reopen(self, connection: Connection) -> None:
        try:
            self.exchanges = await self.open(connection)
        except Exception as exc:  # the connection is going too: the supervisor starts over
            self.supervisor.lose(exc)

    async def ready(self) -> Exchanges:
        """The exchanges to publish to, once publishing channels being reopened are; ``ConnectionLost`` if none."""
        exchanges = self.exchanges
        if exchanges is None and self.reopening is not None and not self.reopening.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(self.reopening)
            exchanges = self.exchanges
        if exchanges is None:
            raise ConnectionLost("not connected to a broker")
        return exchanges

    async def publish(
        self, exchanges: Exchanges, role: Role, routing_key: str, message: OutgoingMessage, *, confirm: bool
    ) -> None:
        """Publish on ``exchanges`` (from ``ready()``): a reply without ``confirm`` on the channel without."""
        exchange = (self.unconfirmed_reply if not confirm and role == "reply" else None) or getattr(exchanges, role)
        channel = self.channel
        try:
            await exchange.publish(message, routing_key=routing_key, mandatory=False)
        except DeliveryError as exc:
            self.refused(channel, exc)
            raise
        except ChannelAccessRefused as exc:
            # The broker's permissions say this account may not publish that (docs/security.md): no retry
            # or reconnect changes it, so say so instead of passing on a transport exception.
            raise RequestFailed("forbidden", f"the broker refused {routing_key!r} on {role}: {exc}") from None

    def lost(self) -> None:
        self.exchanges = self.unconfirmed_reply = self.channel = None


async def _quietly(closing: Awaitable[object]) -> None:
    with contextlib.suppress(Exception):  # closing what the broker may have closed already
        await closing
