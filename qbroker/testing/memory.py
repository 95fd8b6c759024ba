"""An in-memory AMQP broker for tests: RabbitMQ semantics qbroker relies on, without RabbitMQ.

``connect("memory://name")`` returns a connection to the broker called ``name`` (created on first use;
the same name is the same broker within the process). ``Config(url="memory://name")`` makes a ``Unit``
use it once ``qbroker.testing`` is imported (it registers the ``memory`` transport). See docs/testing.md.

Implemented: direct/fanout/topic exchanges, ``alternate-exchange``, the default exchange, queue
arguments ``x-dead-letter-exchange``/``-routing-key`` (with ``x-death``), ``x-message-ttl``, per-message
expiration, ``x-expires``, ``x-max-priority``, ``x-single-active-consumer``, ``x-max-length`` and
``x-max-length-bytes`` (drop-head); exclusive and auto-delete queues, per-consumer prefetch, round-robin,
redelivery of unacked messages, and PRECONDITION_FAILED / NOT_FOUND / RESOURCE_LOCKED errors. Anything else
raises ``UnsupportedFeature``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from aio_pika.abc import AbstractMessage
from aio_pika.exceptions import ChannelNotFoundEntity, ConnectionClosed
from aiormq.exceptions import ChannelLockedResource

from qbroker.testing.memory_client import MemoryChannel, MemoryConnection, MemoryExchange, MemoryQueue
from qbroker.testing.memory_exchanges import ExchangeState, UnsupportedFeature, inequivalent
from qbroker.testing.memory_messages import DeliveredMessage, StoredMessage
from qbroker.testing.memory_queues import QueueState

__all__ = [
    "DeliveredMessage",
    "MemoryBroker",
    "MemoryChannel",
    "MemoryConnection",
    "MemoryExchange",
    "MemoryQueue",
    "QueueInfo",
    "StoredMessage",
    "UnsupportedFeature",
    "connect",
]

SCHEME = "memory"


def broker_name(url: str) -> str:
    """``memory://name`` -> ``name``; query parameters (e.g. heartbeat) are ignored."""
    parts = urlsplit(url)
    if parts.scheme != SCHEME:
        raise ValueError(f"not a memory broker URL: {url!r} (expected memory://name)")
    if parts.path not in ("", "/"):
        raise ValueError(f"memory broker URLs have no vhost path: {url!r} (use another name instead)")
    return parts.netloc or "default"


async def connect(url: str, **_: Any) -> MemoryConnection:
    """Connect to the in-memory broker named by ``url``; aio-pika's keyword arguments are accepted and ignored."""
    broker = MemoryBroker.named(broker_name(url))
    if not broker.available:
        raise ConnectionRefusedError(f"memory broker {broker.name!r} is down (MemoryBroker.available is False)")
    connection = MemoryConnection(broker, url)
    broker.connections.append(connection)
    return connection


@dataclass(frozen=True)
class QueueInfo:
    """A snapshot of one queue, like a row of ``rabbitmqctl list_queues``."""

    name: str
    durable: bool
    exclusive: bool
    auto_delete: bool
    arguments: dict[str, Any]
    messages: int  # ready, waiting for a consumer
    unacked: int
    consumers: int


class MemoryBroker:
    """One in-memory broker; get it with ``MemoryBroker.named(name)`` or ``MemoryBroker.for_url(url)``."""

    _registry: dict[str, MemoryBroker] = {}

    def __init__(self, name: str) -> None:
        self.name = name
        self.exchanges: dict[str, ExchangeState] = {}
        self.queues: dict[str, QueueState] = {}
        self.connections: list[MemoryConnection] = []
        # False: new connections are refused (a broker that is down); existing ones are unaffected.
        self.available = True
        # Routing keys whose next publish loses its connection once routed (``lose_connection_after_routing``).
        self.lost_after_routing: set[str] = set()

    @classmethod
    def named(cls, name: str) -> MemoryBroker:
        if name not in cls._registry:
            cls._registry[name] = cls(name)
        return cls._registry[name]

    @classmethod
    def for_url(cls, url: str) -> MemoryBroker:
        return cls.named(broker_name(url))

    @classmethod
    def discard(cls, name: str) -> None:
        """Reset the broker called ``name`` and forget it (a later connect creates a fresh one)."""
        broker = cls._registry.pop(name, None)
        if broker is not None:
            broker.reset()

    @property
    def url(self) -> str:
        return f"{SCHEME}://{self.name}"

    # -- test controls ---------------------------------------------------------------------------------

    def drop_connections(self, reason: str = "broker forced connection closure") -> int:
        """Close every connection from the broker side with an error (units see a lost connection)."""
        connections, self.connections = self.connections, []
        for connection in connections:
            connection.close_now(ConnectionClosed(320, f"CONNECTION_FORCED - {reason}"))
        return len(connections)

    def lose_connection_after_routing(self, routing_key: str) -> None:
        """The next message published with ``routing_key`` is routed, then its publisher's connection is dropped
        before the publish returns: the publisher never hears that the broker has it (a RabbitMQ node that died
        between taking a message and confirming it)."""
        self.lost_after_routing.add(routing_key)

    def loses_connection_after(self, routing_key: str) -> bool:
        """Whether the publish just routed with ``routing_key`` loses its connection now (asked once)."""
        if routing_key not in self.lost_after_routing:
            return False
        self.lost_after_routing.discard(routing_key)
        return True

    def restart(self) -> None:
        """What a RabbitMQ restart does: connections dropped, transient queues, exchanges and messages lost."""
        self.drop_connections("broker restart")
        for name in [n for n, q in self.queues.items() if not q.durable]:
            self.delete_queue(name)
        for queue in self.queues.values():
            queue.drop_messages(keep=lambda message: message.persistent)
        self.exchanges = {n: e for n, e in self.exchanges.items() if e.durable}

    def reset(self) -> None:
        """Drop every connection, exchange, queue and message."""
        self.drop_connections("broker reset")
        for name in list(self.queues):
            self.delete_queue(name)
        self.exchanges.clear()
        self.available = True

    # -- inspection ------------------------------------------------------------------------------------

    def queue_names(self) -> list[str]:
        return sorted(self.queues)

    def queue_info(self, name: str) -> QueueInfo:
        queue = self.queues[name]
        return QueueInfo(
            name,
            queue.durable,
            queue.exclusive_owner is not None,
            queue.auto_delete,
            dict(queue.arguments),
            queue.message_count,
            queue.unacked,
            len(queue.consumers),
        )

    def list_queues(self) -> list[QueueInfo]:
        return [self.queue_info(name) for name in self.queue_names()]

    def message_count(self, queue: str) -> int:
        return self.queues[queue].message_count

    def messages(self, queue: str) -> list[StoredMessage]:
        """The messages waiting in ``queue``, in delivery order (not removed)."""
        return self.queues[queue].ready_messages()

    def bindings(self, exchange: str) -> list[tuple[str, str]]:
        """(queue, routing key) pairs bound to ``exchange``."""
        return [(b.queue, b.routing_key) for b in self.exchanges[exchange].bindings]

    # -- topology (called by channels) -------------------------------------------------------------------

    def declare_exchange(
        self, name: str, type_: str, *, durable: bool, auto_delete: bool, arguments: dict[str, Any], passive: bool
    ) -> ExchangeState:
        existing = self.exchanges.get(name)
        if passive:
            return self.existing_exchange(name)
        if not name:
            raise inequivalent("exchange", name, "name", "", "the default exchange")
        if existing is not None:
            existing.check_equivalent(type_, durable=durable, auto_delete=auto_delete, arguments=arguments)
            return existing
        exchange = ExchangeState.create(name, type_, durable=durable, auto_delete=auto_delete, arguments=arguments)
        self.exchanges[name] = exchange
        return exchange

    def existing_exchange(self, name: str) -> ExchangeState:
        if name not in self.exchanges:
            raise ChannelNotFoundEntity(f"NOT_FOUND - no exchange '{name}' in vhost '/'")
        return self.exchanges[name]

    def declare_queue(
        self,
        name: str,
        connection_id: int,
        *,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: dict[str, Any],
        passive: bool,
    ) -> QueueState:
        if passive or name in self.queues:
            queue = self.queue_for(name, connection_id)
            if not passive:
                queue.check_equivalent(durable=durable, auto_delete=auto_delete, arguments=arguments)
                if exclusive != (queue.exclusive_owner is not None):
                    raise _locked(name)
                queue.touch()  # redeclaring renews an x-expires lease
            return queue
        queue = QueueState.create(
            self,
            name,
            durable=durable,
            exclusive_owner=connection_id if exclusive else None,
            auto_delete=auto_delete,
            arguments=arguments,
        )
        self.queues[name] = queue
        queue.touch()
        return queue

    def queue_for(self, name: str, connection_id: int) -> QueueState:
        """The queue ``name``, checking that this connection may use it (exclusive queues)."""
        queue = self.queues.get(name)
        if queue is None:
            raise ChannelNotFoundEntity(f"NOT_FOUND - no queue '{name}' in vhost '/'")
        if queue.exclusive_owner is not None and queue.exclusive_owner != connection_id:
            raise _locked(name)
        return queue

    def bind(self, queue: str, exchange: str, routing_key: str, connection_id: int) -> None:
        self.queue_for(queue, connection_id)
        self.existing_exchange(exchange).bind(queue, routing_key)

    def unbind(self, queue: str, exchange: str, routing_key: str) -> None:
        self.existing_exchange(exchange).unbind(queue, routing_key)

    def delete_queue(self, name: str) -> None:
        queue = self.queues.pop(name, None)
        if queue is None:
            return
        queue.cancel_expiry()
        queue.drop_messages()  # stops their expiry timers
        for exchange in self.exchanges.values():
            exchange.forget_queue(name)

    def connection_closed(self, connection: MemoryConnection) -> None:
        if connection in self.connections:
            self.connections.remove(connection)
        for name in [n for n, q in self.queues.items() if q.exclusive_owner == connection.id]:
            self.delete_queue(name)

    # -- routing -------------------------------------------------------------------------------------------

    def publish(self, exchange: str, routing_key: str, message: AbstractMessage) -> bool:
        """Route a published message; False if no queue took it (after the alternate exchanges)."""
        if exchange:
            self.existing_exchange(exchange)
        stored = StoredMessage.from_published(message, exchange, routing_key)
        targets = self._route(exchange, routing_key)
        for queue in targets:
            queue.enqueue(stored)
        return bool(targets)

    def _route(self, exchange: str, routing_key: str) -> list[QueueState]:
        if not exchange:  # the default exchange: every queue is bound by its own name
            return [self.queues[routing_key]] if routing_key in self.queues else []
        seen: set[str] = set()
        name: str | None = exchange
        while name is not None and name not in seen and name in self.exchanges:
            seen.add(name)
            state = self.exchanges[name]
            names = state.route(routing_key)
            if names:
                return [self.queues[n] for n in names if n in self.queues]
            name = state.alternate_exchange  # unroutable here: try the alternate exchange
        return []

    def dead_letter(self, queue: QueueState, message: StoredMessage, reason: str) -> None:
        """Republish a message that died in ``queue`` to its dead-letter exchange, if it has one."""
        dlx = queue.arguments.get("x-dead-letter-exchange")
        if dlx is None:
            return
        dead = message.dead_lettered(
            reason=reason, queue=queue.name, dead_letter_routing_key=queue.arguments.get("x-dead-letter-routing-key")
        )
        dead = replace(dead, exchange=str(dlx))
        deaths = dead.headers["x-death"]
        died_in = {d.get("queue") for d in deaths}
        rejected = any(d.get("reason") == "rejected" for d in deaths)
        for target in self._route(str(dlx), dead.routing_key):
            # RabbitMQ drops a message cycling back to a queue it already died in, unless it was rejected.
            if target.name in died_in and not rejected:
                continue
            target.enqueue(dead)

    def __repr__(self) -> str:
        return f"<MemoryBroker {self.name!r}: {len(self.queues)} queues, {len(self.connections)} connections>"


def _locked(name: str) -> ChannelLockedResource:
    return ChannelLockedResource(
        f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' in vhost '/'. It could be "
        "originally declared on another connection or the exclusive property value does not match that of "
        "the original declaration."
    )
