"""Client-side objects of the in-memory broker: connection, channel, exchange and queue handles.

They mirror the parts of aio-pika's abstract API that qbroker uses (see docs/testing.md), including its
failure behaviour: a declare conflict closes the channel (as RabbitMQ does), a closed channel refuses
work with ``ChannelInvalidStateError``, and closing a channel cancels its running consumer callbacks
and requeues its unacked deliveries.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import uuid
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aio_pika import ExchangeType
from aio_pika.abc import AbstractMessage
from aio_pika.exceptions import ChannelClosed, ChannelInvalidStateError, ConnectionClosed, DuplicateConsumerTag

from qbroker.testing.memory_exchanges import UnsupportedFeature
from qbroker.testing.memory_messages import DeliveredMessage
from qbroker.testing.memory_queues import Consumer, ConsumerCallback, QueuedMessage, QueueState

if TYPE_CHECKING:
    from qbroker.testing.memory import MemoryBroker

log = logging.getLogger("qbroker.testing.memory")
CloseCallback = Callable[[Any, BaseException | None], Any]
_connection_ids = itertools.count(1)


class CloseCallbacks:
    """aio-pika's ``CallbackCollection`` as far as qbroker uses it: ``add(cb)``, called as ``cb(sender, exc)``."""

    def __init__(self, sender: object) -> None:
        self._sender = sender
        self._strong: list[CloseCallback] = []
        self._weak: weakref.WeakSet[Any] = weakref.WeakSet()
        self._pending: set[asyncio.Future[Any]] = set()  # coroutine callbacks still running

    def add(self, callback: CloseCallback, weak: bool = False) -> None:
        if not callable(callback):
            raise ValueError("Callback is not callable")
        if weak:
            self._weak.add(callback)
        elif callback not in self._strong:
            self._strong.append(callback)

    def discard(self, callback: CloseCallback) -> None:
        if callback in self._strong:
            self._strong.remove(callback)
        self._weak.discard(callback)

    remove = discard

    def __contains__(self, callback: object) -> bool:
        return callback in self._strong or callback in self._weak

    def __len__(self) -> int:
        return len(self._strong) + len(self._weak)

    def __iter__(self) -> Iterator[CloseCallback]:
        return iter([*self._strong, *self._weak])

    def fire(self, exc: BaseException | None) -> None:
        for callback in list(self):
            try:
                result = callback(self._sender, exc)
                if inspect.isawaitable(result):
                    future = asyncio.ensure_future(result)
                    self._pending.add(future)
                    future.add_done_callback(self._pending.discard)
            except Exception:  # aio-pika logs a failing callback and calls the others
                log.exception("close callback %r failed", callback)


class MemoryConnection:
    def __init__(self, broker: MemoryBroker, url: str) -> None:
        self.broker = broker
        self.url = url
        self.id = next(_connection_ids)
        self.close_callbacks = CloseCallbacks(self)
        self._channels: list[MemoryChannel] = []
        self._numbers = itertools.count(1)
        self._closed = False

    @property
    def is_closed(self) -> bool:
        return self._closed

    async def channel(
        self, channel_number: int | None = None, publisher_confirms: bool = True, on_return_raises: bool = False
    ) -> MemoryChannel:
        if self._closed:
            raise ChannelInvalidStateError("connection is closed")
        if on_return_raises:
            raise UnsupportedFeature("on_return_raises (returned messages are logged and dropped)")
        channel = MemoryChannel(self, channel_number or next(self._numbers), publisher_confirms=publisher_confirms)
        self._channels.append(channel)
        return channel

    async def close(self, exc: BaseException | None = None) -> None:
        tasks = self.close_now(exc)
        current = asyncio.current_task()
        # aio-pika waits for the cancelled consumer callbacks; a callback closing its own connection can't.
        await asyncio.gather(*(t for t in tasks if t is not current), return_exceptions=True)

    def close_now(self, exc: BaseException | None) -> list[asyncio.Task[Any]]:
        """Close at once (the broker side of a close); return the cancelled callback tasks."""
        if self._closed:
            return []
        self._closed = True
        tasks: list[asyncio.Task[Any]] = []
        for channel in self._channels:
            tasks += channel.close_now(exc)
        self._channels.clear()
        self.broker.connection_closed(self)
        self.close_callbacks.fire(exc)
        return tasks

    async def __aenter__(self) -> MemoryConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<MemoryConnection {self.url} #{self.id}{' closed' if self._closed else ''}>"


class MemoryChannel:
    def __init__(self, connection: MemoryConnection, number: int, *, publisher_confirms: bool) -> None:
        self.connection = connection
        self.number = number
        # Every publish is routed before it returns, so a confirm is implied either way.
        self.publisher_confirms = publisher_confirms
        self.close_callbacks = CloseCallbacks(self)
        self.prefetch_count = 0
        self.is_closed = False
        self._consumers: dict[str, Consumer] = {}
        self._unacked: dict[int, tuple[Consumer, QueuedMessage]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._tags = itertools.count(1)

    @property
    def broker(self) -> MemoryBroker:
        return self.connection.broker

    def _ensure_open(self) -> None:
        if self.is_closed:
            raise ChannelInvalidStateError(f"channel {self.number} is closed")

    def _broker_call(self, operation: Callable[[], Any]) -> Any:
        """Run a broker operation; a channel-level AMQP error closes this channel, as RabbitMQ does."""
        self._ensure_open()
        try:
            return operation()
        except ChannelClosed as exc:
            self.close_now(exc)
            raise

    # -- topology ----------------------------------------------------------------------------------

    async def declare_exchange(
        self,
        name: str,
        type: ExchangeType | str = ExchangeType.DIRECT,
        *,
        durable: bool = False,
        auto_delete: bool = False,
        passive: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> MemoryExchange:
        type_name = type.value if isinstance(type, ExchangeType) else str(type)
        self._broker_call(
            lambda: self.broker.declare_exchange(
                name, type_name, durable=durable, auto_delete=auto_delete, arguments=arguments or {}, passive=passive
            )
        )
        return MemoryExchange(self, name)

    async def get_exchange(self, name: str, *, ensure: bool = True) -> MemoryExchange:
        if ensure:
            self._broker_call(lambda: self.broker.existing_exchange(name))
        return MemoryExchange(self, name)

    @property
    def default_exchange(self) -> MemoryExchange:
        return MemoryExchange(self, "")

    async def declare_queue(
        self,
        name: str | None = None,
        *,
        durable: bool = False,
        exclusive: bool = False,
        passive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> MemoryQueue:
        queue = self._broker_call(
            lambda: self.broker.declare_queue(
                name or f"amq.gen-{uuid.uuid4().hex}",
                self.connection.id,
                durable=durable,
                exclusive=exclusive,
                auto_delete=auto_delete,
                arguments=arguments or {},
                passive=passive,
            )
        )
        return MemoryQueue(self, queue.name)

    async def get_queue(self, name: str, *, ensure: bool = True) -> MemoryQueue:
        if ensure:
            self._broker_call(lambda: self.broker.queue_for(name, self.connection.id))
        return MemoryQueue(self, name)

    async def set_qos(self, prefetch_count: int = 0) -> None:
        """Per-consumer prefetch (basic.qos with global=false): applies to consumers created after it."""
        self._ensure_open()
        if prefetch_count < 0:
            raise ValueError("prefetch_count must be >= 0")
        self.prefetch_count = prefetch_count

    # -- consuming -----------------------------------------------------------------------------------

    def consume(
        self, queue_name: str, callback: ConsumerCallback, *, no_ack: bool, consumer_tag: str | None, priority: int = 0
    ) -> str:
        queue: QueueState = self._broker_call(lambda: self.broker.queue_for(queue_name, self.connection.id))
        tag = consumer_tag or f"amq.ctag-{uuid.uuid4().hex}"
        if tag in self._consumers:
            self._broker_call(lambda: _raise(DuplicateConsumerTag(tag)))
        consumer = Consumer(tag, queue, self, callback, no_ack, self.prefetch_count, priority=priority)
        self._consumers[tag] = consumer
        queue.add_consumer(consumer)
        return tag

    def cancel(self, consumer_tag: str) -> None:
        self._ensure_open()
        consumer = self._consumers.pop(consumer_tag, None)
        if consumer is not None:
            consumer.queue.remove_consumer(consumer)

    def deliver(self, consumer: Consumer, queue: QueueState, entry: QueuedMessage) -> None:
        tag = next(self._tags)
        if not consumer.no_ack:
            self._unacked[tag] = (consumer, entry)
        message = DeliveredMessage(
            entry.message,
            delivery_tag=tag,
            consumer_tag=consumer.tag,
            redelivered=entry.redelivered,
            no_ack=consumer.no_ack,
            settle=self._settle,
            channel_open=lambda: not self.is_closed,
        )
        # aio-pika runs every delivery callback in a task of its own, owned by the channel.
        task = asyncio.get_running_loop().create_task(_run_callback(consumer.callback, message))
        self._tasks.add(task)
        task.add_done_callback(self._callback_done)

    def _callback_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("Consumer callback failed", exc_info=task.exception())

    def _settle(self, message: DeliveredMessage, action: str, requeue: bool) -> None:
        consumer, entry = self._unacked.pop(message.delivery_tag)
        outcome = "ack" if action == "ack" else ("requeue" if requeue else "reject")
        consumer.queue.settled(consumer, entry, outcome=outcome)

    # -- publishing ----------------------------------------------------------------------------------

    def publish(self, exchange: str, message: AbstractMessage, routing_key: str, *, mandatory: bool) -> None:
        broker = self.broker
        routed = self._broker_call(lambda: broker.publish(exchange, routing_key, message))
        if broker.lost_after_routing and broker.loses_connection_after(routing_key):
            lost = ConnectionClosed(320, "CONNECTION_FORCED - lost before the confirm (lose_connection_after_routing)")
            self.connection.close_now(lost)
            raise lost
        if not routed and mandatory:
            # RabbitMQ returns the message (basic.return); without return callbacks aio-pika drops it.
            log.warning("message to %r with routing key %r returned: no route", exchange, routing_key)

    # -- closing -------------------------------------------------------------------------------------

    async def close(self, exc: BaseException | None = None) -> None:
        tasks = self.close_now(exc)
        current = asyncio.current_task()
        await asyncio.gather(*(t for t in tasks if t is not current), return_exceptions=True)

    def close_now(self, exc: BaseException | None) -> list[asyncio.Task[Any]]:
        if self.is_closed:
            return []
        self.is_closed = True
        # Unacked deliveries go back to their queues, the oldest ending up first, flagged redelivered.
        for _, (consumer, entry) in sorted(self._unacked.items(), reverse=True):
            consumer.queue.settled(consumer, entry, outcome="lost")
        self._unacked.clear()
        for consumer in self._consumers.values():
            consumer.queue.remove_consumer(consumer)
        self._consumers.clear()
        tasks = [t for t in self._tasks if not t.done()]
        for task in tasks:
            task.cancel()
        self.close_callbacks.fire(exc)
        return tasks

    def __repr__(self) -> str:
        return f"<MemoryChannel #{self.number} of {self.connection!r}>"


def _raise(exc: BaseException) -> None:
    raise exc


async def _run_callback(callback: ConsumerCallback, message: DeliveredMessage) -> None:
    await callback(message)


class MemoryExchange:
    def __init__(self, channel: MemoryChannel, name: str) -> None:
        self.channel = channel
        self.name = name

    async def publish(self, message: AbstractMessage, routing_key: str, *, mandatory: bool = True) -> None:
        self.channel.publish(self.name, message, routing_key, mandatory=mandatory)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<MemoryExchange {self.name!r}>"


@dataclass(frozen=True)
class DeclareOk:
    queue: str
    message_count: int
    consumer_count: int


class MemoryQueue:
    def __init__(self, channel: MemoryChannel, name: str) -> None:
        self.channel = channel
        self.name = name

    async def bind(self, exchange: MemoryExchange | str, routing_key: str | None = None) -> None:
        exchange_name = exchange.name if isinstance(exchange, MemoryExchange) else exchange
        key = self.name if routing_key is None else routing_key  # aio-pika's default
        self.channel._broker_call(
            lambda: self.channel.broker.bind(self.name, exchange_name, key, self.channel.connection.id)
        )

    async def unbind(self, exchange: MemoryExchange | str, routing_key: str | None = None) -> None:
        exchange_name = exchange.name if isinstance(exchange, MemoryExchange) else exchange
        key = self.name if routing_key is None else routing_key
        self.channel._broker_call(lambda: self.channel.broker.unbind(self.name, exchange_name, key))

    async def consume(
        self,
        callback: ConsumerCallback,
        no_ack: bool = False,
        consumer_tag: str | None = None,
        *,
        arguments: dict[str, Any] | None = None,
    ) -> str:
        priority = int((arguments or {}).get("x-priority", 0))
        return self.channel.consume(self.name, callback, no_ack=no_ack, consumer_tag=consumer_tag, priority=priority)

    async def cancel(self, consumer_tag: str) -> None:
        self.channel.cancel(consumer_tag)

    @property
    def declaration_result(self) -> DeclareOk:
        """What aio-pika keeps of queue.declare-ok: counts at the time of asking (here: now)."""
        state = self.channel.broker.queues.get(self.name)
        if state is None:
            return DeclareOk(self.name, 0, 0)
        return DeclareOk(self.name, state.message_count, len(state.consumers))

    async def delete(self, *, if_unused: bool = True, if_empty: bool = True) -> None:
        if if_unused or if_empty:
            raise UnsupportedFeature("queue.delete with if_unused/if_empty (pass both as False)")
        self.channel._broker_call(lambda: self.channel.broker.delete_queue(self.name))

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<MemoryQueue {self.name!r}>"
