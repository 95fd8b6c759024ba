"""The ``amqp://`` transport: aio-pika for the rare operations, aiormq for each message.

Declaring, binding, qos and closing go through aio-pika as before; they happen once per connection. The
per-message work does not: a delivery reaches the consumer as a ``Delivery``, a thin view of aiormq's
``DeliveredMessage`` that reads the AMQP properties only when asked, instead of aio-pika's
``IncomingMessage``, which copies every property through a locked ``__setattr__`` and adds a second
task per delivery. (The message published goes the other way as ``qbroker.envelope.OutgoingMessage``,
whose pamqp properties are built directly.) On a profile of 64 calls in flight these two objects were
about a fifth of the client stack's time (docs/performance.md).

The classes are aio-pika's own, subclassed only where a message passes (``Queue.consume``), so every
other caller of a channel (the osm wire, the scheduler, the CLI) keeps aio-pika's full API.
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable
from typing import Any, cast

import aio_pika
import aiormq
from aio_pika.exceptions import ChannelInvalidStateError, MessageProcessError
from aiormq.abc import DeliveredMessage


class Delivery:
    """One delivered message, with the attributes of aio-pika's ``IncomingMessage`` that consumers read
    (properties, routing, ``ack`` / ``nack`` / ``reject`` with the same errors), read lazily."""

    __slots__ = ("_message", "_properties", "_processed", "no_ack")

    def __init__(self, message: DeliveredMessage, no_ack: bool) -> None:
        self._message = message
        self._properties = message.header.properties
        self.no_ack = no_ack
        self._processed = no_ack

    # -- body and properties --------------------------------------------------------------------------

    @property
    def body(self) -> bytes:
        return self._message.body

    @property
    def headers(self) -> dict[str, Any]:
        headers = self._properties.headers
        if headers is None:
            headers = self._properties.headers = {}
        return headers

    @property
    def content_type(self) -> str | None:
        return self._properties.content_type

    @property
    def content_encoding(self) -> str | None:
        return self._properties.content_encoding

    @property
    def delivery_mode(self) -> int:
        return self._properties.delivery_mode or 1  # absent is transient, as aio-pika reads it

    @property
    def persistent(self) -> bool:
        return self._properties.delivery_mode == 2

    @property
    def priority(self) -> int | None:
        return self._properties.priority

    @property
    def correlation_id(self) -> str | None:
        return self._properties.correlation_id

    @property
    def reply_to(self) -> str | None:
        return self._properties.reply_to

    @property
    def expiration(self) -> float | None:
        """Seconds, as aio-pika gives it (the wire carries milliseconds as text)."""
        raw = self._properties.expiration
        try:
            return float(raw) / 1000 if raw is not None else None
        except ValueError:  # a foreign client's odd value: unreadable is the same as absent
            return None

    @property
    def message_id(self) -> str | None:
        return self._properties.message_id

    @property
    def timestamp(self) -> datetime.datetime | None:
        return self._properties.timestamp

    @property
    def type(self) -> str | None:
        return self._properties.message_type

    @property
    def user_id(self) -> str | None:
        return self._properties.user_id

    @property
    def app_id(self) -> str | None:
        return self._properties.app_id

    @property
    def cluster_id(self) -> str | None:
        return self._properties.cluster_id

    # -- delivery ----------------------------------------------------------------------------------------

    @property
    def exchange(self) -> str | None:
        return self._message.exchange

    @property
    def routing_key(self) -> str | None:
        return self._message.routing_key

    @property
    def delivery_tag(self) -> int | None:
        return self._message.delivery_tag

    @property
    def consumer_tag(self) -> str | None:
        return self._message.consumer_tag

    @property
    def redelivered(self) -> bool | None:
        return self._message.redelivered

    @property
    def channel(self) -> aiormq.abc.AbstractChannel:
        channel = self._message.channel
        if channel.is_closed:
            raise ChannelInvalidStateError("the channel this message was delivered on is closed")
        return channel

    @property
    def processed(self) -> bool:
        return self._processed

    def _settle(self, verb: str) -> int | None:
        if self.no_ack:
            raise TypeError(f'Can\'t {verb} message with "no_ack" flag')
        if self._processed:
            raise MessageProcessError("Message already processed", self)
        return self._message.delivery_tag

    async def ack(self, multiple: bool = False) -> None:
        tag = self._settle("ack")
        if tag is not None:
            # Queued, not awaited until written, as publishes are (``_Exchange.publish``); a unit's stop
            # gets what is queued out before it closes (``Bus.flush``).
            await self.channel.basic_ack(delivery_tag=tag, multiple=multiple, wait=False)
        self._processed = True

    async def reject(self, requeue: bool = False) -> None:
        tag = self._settle("reject")
        if tag is not None:
            await self.channel.basic_reject(delivery_tag=tag, requeue=requeue)
        self._processed = True

    async def nack(self, multiple: bool = False, requeue: bool = True) -> None:
        tag = self._settle("nack")
        if tag is not None:
            await self.channel.basic_nack(delivery_tag=tag, multiple=multiple, requeue=requeue)
        self._processed = True

    def __repr__(self) -> str:
        return (
            f"<Delivery exchange={self.exchange!r} routing_key={self.routing_key!r} "
            f"message_id={self.message_id!r} tag={self.delivery_tag}>"
        )


class _Queue(aio_pika.Queue):
    async def consume(  # type: ignore[override]
        self,
        callback: Callable[[Delivery], Awaitable[Any]],
        no_ack: bool = False,
        exclusive: bool = False,
        arguments: dict[str, Any] | None = None,
        consumer_tag: str | None = None,
        timeout: float | None = None,
    ) -> str:
        """aio-pika's consume, handing the callback a ``Delivery``: aiormq runs each delivery in a task
        of its own already, so no second task is made for it."""

        async def deliver(message: DeliveredMessage) -> None:
            result = callback(Delivery(message, no_ack))
            if isinstance(result, Awaitable):
                await result

        channel = await self.channel.get_underlay_channel()
        consume_ok = await channel.basic_consume(
            queue=self.name,
            consumer_callback=deliver,
            exclusive=exclusive,
            no_ack=no_ack,
            arguments=arguments,
            consumer_tag=consumer_tag,
            timeout=timeout,
        )
        if consume_ok.consumer_tag is None:
            raise RuntimeError("the broker gave no consumer tag")
        return consume_ok.consumer_tag


class _Exchange(aio_pika.Exchange):
    async def publish(  # type: ignore[override]
        self,
        message: Any,
        routing_key: str,
        *,
        mandatory: bool = True,
        immediate: bool = False,
        timeout: float | None = None,
    ) -> Any:
        """aio-pika's publish, without waiting for the socket write: the frames go on the connection's
        one write queue and this returns (on a channel with confirms: once the broker confirms). aio-pika
        and aiormq wait for the writer task to have written each publish, a second task switch per
        message that orders nothing the queue does not order already: a reply queued before its
        request's ack is written before it, and a connection that dies loses both or neither's effect
        (the request is redelivered). Backpressure stays: the writer drains the socket as it writes. A
        close drops what is still queued: a unit's stop flushes first (``Bus.flush``)."""
        if self.internal:  # as aio-pika: refused here, before the broker closes the channel for it
            raise ValueError(f"Can not publish to internal exchange: '{self.name}'!")
        if self.channel.is_closed:
            raise ChannelInvalidStateError(f"{self.channel!r} closed")
        # aiormq's Channel, whose basic_publish takes ``wait`` (its abstract class does not say so).
        channel = cast(aiormq.Channel, await self.channel.get_underlay_channel())
        return await channel.basic_publish(
            message.body,
            exchange=self.name,
            routing_key=routing_key,
            properties=message.properties,
            mandatory=mandatory,
            immediate=immediate,
            timeout=timeout,
            wait=False,
        )


class _Channel(aio_pika.Channel):
    QUEUE_CLASS = _Queue
    EXCHANGE_CLASS = _Exchange


class _Connection(aio_pika.Connection):
    CHANNEL_CLASS = _Channel


async def connect_amqp(url: str, *, timeout: float) -> aio_pika.Connection:
    connection: aio_pika.Connection = await aio_pika.connect(url, timeout=timeout, connection_class=_Connection)
    return connection
