"""Queues of the in-memory broker: ordering, priorities, TTL, dead-lettering, consumers and prefetch."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from qbroker.testing.memory_exchanges import UnsupportedFeature, inequivalent
from qbroker.testing.memory_messages import DeliveredMessage, StoredMessage

if TYPE_CHECKING:
    from qbroker.testing.memory import MemoryBroker

ConsumerCallback = Callable[[DeliveredMessage], Awaitable[Any]]

# Arguments whose semantics the memory broker implements, plus ones that change nothing a test sees.
QUEUE_ARGUMENTS = frozenset(
    {
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-message-ttl",
        "x-max-priority",
        "x-single-active-consumer",
        "x-max-length",
        "x-max-length-bytes",
        "x-overflow",
        "x-queue-type",
        "x-expires",
    }
)


@dataclass(eq=False)
class QueuedMessage:
    """A message waiting in (or delivered from, not yet acked) one queue."""

    message: StoredMessage
    expires_at: float | None  # event-loop time; fixed at enqueue, kept across redeliveries
    redelivered: bool = False
    # Expired or dropped while still sitting in its deque: skipped when popped (O(1) removal).
    removed: bool = False
    timer: asyncio.TimerHandle | None = None

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class DeliverySink(Protocol):
    """The channel side of a consumer: turns a queued message into a callback task."""

    is_closed: bool

    def deliver(self, consumer: Consumer, queue: QueueState, entry: QueuedMessage) -> None: ...


@dataclass(eq=False)
class Consumer:
    tag: str
    queue: QueueState
    sink: DeliverySink
    callback: ConsumerCallback
    no_ack: bool
    prefetch: int  # 0 = unlimited, as in basic.qos
    unacked: int = 0
    priority: int = 0  # x-priority: higher first; lower only while every higher one is full

    @property
    def has_capacity(self) -> bool:
        # RabbitMQ ignores prefetch for no-ack consumers: nothing is ever outstanding.
        return self.no_ack or self.prefetch == 0 or self.unacked < self.prefetch


@dataclass(eq=False)
class QueueState:
    broker: MemoryBroker
    name: str
    durable: bool
    exclusive_owner: int | None  # id of the owning connection
    auto_delete: bool
    arguments: dict[str, Any]
    consumers: list[Consumer] = field(default_factory=list)
    unacked: int = 0
    _levels: list[deque[QueuedMessage]] = field(default_factory=list)
    _ready: int = 0
    _tombstones: int = 0  # expired entries still sitting in the deques
    _round_robin: int = 0
    _had_consumer: bool = False
    _dispatching: bool = False
    _expiry: asyncio.TimerHandle | None = None

    @classmethod
    def create(
        cls,
        broker: MemoryBroker,
        name: str,
        *,
        durable: bool,
        exclusive_owner: int | None,
        auto_delete: bool,
        arguments: dict[str, Any],
    ) -> QueueState:
        unknown = set(arguments) - QUEUE_ARGUMENTS
        if unknown:
            raise UnsupportedFeature(f"queue arguments {sorted(unknown)} (supported: {sorted(QUEUE_ARGUMENTS)})")
        if arguments.get("x-overflow", "drop-head") != "drop-head":
            raise UnsupportedFeature("x-overflow other than drop-head")
        if arguments.get("x-queue-type", "classic") != "classic":
            raise UnsupportedFeature("queue types other than classic")
        queue = cls(broker, name, durable, exclusive_owner, auto_delete, dict(arguments))
        queue._levels = [deque() for _ in range(queue.max_priority + 1)]
        return queue

    def check_equivalent(self, *, durable: bool, auto_delete: bool, arguments: dict[str, Any]) -> None:
        for what, received, current in (
            ("durable", durable, self.durable),
            ("auto_delete", auto_delete, self.auto_delete),
        ):
            if received != current:
                raise inequivalent("queue", self.name, what, received, current)
        for key in sorted(set(arguments) | set(self.arguments)):
            if arguments.get(key) != self.arguments.get(key):
                raise inequivalent("queue", self.name, key, arguments.get(key), self.arguments.get(key))

    # -- settings ------------------------------------------------------------------------------

    @property
    def max_priority(self) -> int:
        return int(self.arguments.get("x-max-priority") or 0)

    @property
    def single_active(self) -> bool:
        return bool(self.arguments.get("x-single-active-consumer"))

    @property
    def message_count(self) -> int:
        """Messages ready for delivery (what ``rabbitmqctl list_queues messages_ready`` shows)."""
        return self._ready

    def ready_messages(self) -> list[StoredMessage]:
        """The waiting messages in delivery order."""
        return [e.message for level in reversed(self._levels) for e in level if not e.removed]

    # -- enqueueing and expiry --------------------------------------------------------------------

    def enqueue(self, message: StoredMessage) -> None:
        loop = asyncio.get_running_loop()
        ttls = [t for t in (message.expiration_ms, self.arguments.get("x-message-ttl")) if t is not None]
        expires_at = loop.time() + min(ttls) / 1000 if ttls else None
        entry = QueuedMessage(message, expires_at)
        self._push(entry, front=False)
        max_length = self.arguments.get("x-max-length")
        while max_length is not None and self._ready > int(max_length):
            head = self._pop()
            if head is not None:
                self.broker.dead_letter(self, head.message, "maxlen")
        max_bytes = self.arguments.get("x-max-length-bytes")  # counted when asked for: few queues set it
        while max_bytes is not None and self._ready and sum(map(len, self._ready_bodies())) > int(max_bytes):
            head = self._pop()
            if head is not None:
                self.broker.dead_letter(self, head.message, "maxlen")
        self.dispatch()

    def _ready_bodies(self) -> list[bytes]:
        return [message.body for message in self.ready_messages()]

    def requeue(self, entry: QueuedMessage) -> None:
        """A delivery nacked with requeue, or left unacked when its channel closed."""
        entry.redelivered = True
        entry.removed = False
        if entry.expires_at is not None and entry.expires_at <= asyncio.get_running_loop().time():
            self.broker.dead_letter(self, entry.message, "expired")  # its TTL ran out while it was out
            self.dispatch()
            return
        self._push(entry, front=True)
        self.dispatch()

    def _push(self, entry: QueuedMessage, *, front: bool) -> None:
        level = min(max(entry.message.priority or 0, 0), self.max_priority)
        if front:
            self._levels[level].appendleft(entry)
        else:
            self._levels[level].append(entry)
        self._ready += 1
        if entry.expires_at is not None:
            # A timer per message, so a message expires where it waits, not only at the head.
            loop = asyncio.get_running_loop()
            entry.timer = loop.call_at(entry.expires_at, self._expire, entry)

    def _expire(self, entry: QueuedMessage) -> None:
        entry.timer = None
        if entry.removed or self.broker.queues.get(self.name) is not self:
            return
        entry.removed = True
        self._ready -= 1
        self._tombstones += 1
        if self._tombstones > 1000 and self._tombstones > self._ready:
            self._compact()  # a queue nobody consumes would otherwise keep every expired message
        self.broker.dead_letter(self, entry.message, "expired")

    def _compact(self) -> None:
        for level in self._levels:
            kept = [e for e in level if not e.removed]
            level.clear()
            level.extend(kept)
        self._tombstones = 0

    def _pop(self) -> QueuedMessage | None:
        for level in reversed(self._levels):
            while level:
                entry = level.popleft()
                if entry.removed:
                    self._tombstones = max(0, self._tombstones - 1)
                    continue
                entry.cancel_timer()
                self._ready -= 1
                return entry
        return None

    def drop_messages(self, keep: Callable[[StoredMessage], bool] | None = None) -> int:
        """Remove waiting messages (all, or those ``keep`` rejects) without dead-lettering them."""
        dropped = 0
        for level in self._levels:
            for entry in level:
                if not entry.removed and not (keep is not None and keep(entry.message)):
                    entry.removed = True
                    entry.cancel_timer()
                    self._ready -= 1
                    dropped += 1
        self._compact()
        return dropped

    # -- consumers --------------------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self._had_consumer = True
        self.touch()
        self.dispatch()

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        if self.auto_delete and self._had_consumer and not self.consumers:
            self.broker.delete_queue(self.name)
        else:
            self.touch()
            self.dispatch()  # with single-active-consumer, the next consumer takes over

    def touch(self) -> None:
        """``x-expires``: (re)start the lease; an unused queue (no consumers, not redeclared) is deleted
        when it runs out, its messages with it (RabbitMQ does not dead-letter them either)."""
        self.cancel_expiry()
        expires = self.arguments.get("x-expires")
        if expires is not None and not self.consumers:
            self._expiry = asyncio.get_running_loop().call_later(int(expires) / 1000, self._expired)

    def cancel_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    def _expired(self) -> None:
        self._expiry = None
        if not self.consumers and self.broker.queues.get(self.name) is self:
            self.broker.delete_queue(self.name)

    def _next_consumer(self) -> Consumer | None:
        candidates = [c for c in self.consumers[: 1 if self.single_active else None] if not c.sink.is_closed]
        ready = [c for c in candidates if c.has_capacity]
        if ready:  # RabbitMQ: round-robin among the highest-priority consumers that can take a message
            top = max(c.priority for c in ready)
            candidates = [c for c in candidates if c.priority == top]
        for i in range(len(candidates)):
            consumer = candidates[(self._round_robin + i) % len(candidates)]
            if consumer.has_capacity:
                self._round_robin = (self._round_robin + i + 1) % len(candidates)
                return consumer
        return None

    def dispatch(self) -> None:
        if self._dispatching:  # a delivery that re-enters (e.g. via dead-lettering) is picked up by the loop
            return
        self._dispatching = True
        try:
            while self._ready:
                consumer = self._next_consumer()
                if consumer is None:
                    return
                entry = self._pop()
                if entry is None:
                    return
                if not consumer.no_ack:
                    consumer.unacked += 1
                    self.unacked += 1
                consumer.sink.deliver(consumer, self, entry)
        finally:
            self._dispatching = False

    def settled(self, consumer: Consumer, entry: QueuedMessage, *, outcome: str) -> None:
        """A delivery was acked, rejected or returned; ``outcome`` is ack, requeue, reject or lost."""
        consumer.unacked -= 1
        self.unacked -= 1
        if self.broker.queues.get(self.name) is not self:
            return  # the queue was deleted meanwhile; its messages went with it
        if outcome == "requeue" or outcome == "lost":
            self.requeue(entry)
            return
        if outcome == "reject":
            self.broker.dead_letter(self, entry.message, "rejected")
        self.dispatch()
