"""Transports by URL scheme (kombu's ``TRANSPORT_ALIASES``): what qbroker uses of a broker connection.

qbroker needs little of a connection: open channels, declare exchanges and queues, bind, consume,
publish, and be told when a channel or the connection closes. The protocols below say exactly that,
so any client that offers it can carry a unit. ``amqp://`` and ``amqps://`` are aio-pika with aiormq
under each message (``qbroker.amqp_transport``); other schemes are registered by whoever provides them
(``import qbroker.testing`` registers ``memory://``), so production code never loads a test double.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol
from urllib.parse import urlsplit

from aio_pika import ExchangeType

from qbroker.amqp_transport import connect_amqp

# Consumers receive the transport's own incoming message (``amqp_transport.Delivery`` or a double with
# the same attributes: aio-pika's IncomingMessage names); qbroker reads it through qbroker.envelope.
Consumer = Callable[[Any], Awaitable[Any]]


class CloseCallbacks(Protocol):
    def add(self, callback: Callable[..., Any], weak: bool = False) -> None: ...


class Exchange(Protocol):
    @property
    def name(self) -> str: ...

    # ``message`` is a qbroker.envelope.OutgoingMessage or an aio_pika.Message: both have ``body`` and the
    # AMQP ``properties`` (and aio-pika's attribute names), which is all a transport reads.
    async def publish(self, message: Any, routing_key: str, *, mandatory: bool = True) -> object: ...


class Queue(Protocol):
    @property
    def name(self) -> str: ...

    async def bind(self, exchange: Any, routing_key: str | None = None) -> object: ...

    async def unbind(self, exchange: Any, routing_key: str | None = None) -> object: ...

    async def consume(
        self, callback: Consumer, no_ack: bool = False, *, arguments: dict[str, Any] | None = None
    ) -> str: ...

    async def cancel(self, consumer_tag: str) -> object: ...

    async def delete(self, *, if_unused: bool = True, if_empty: bool = True) -> object: ...


class Channel(Protocol):
    @property
    def close_callbacks(self) -> CloseCallbacks: ...

    @property
    def is_closed(self) -> bool: ...

    async def declare_exchange(
        self,
        name: str,
        type: ExchangeType | str = ExchangeType.DIRECT,
        *,
        durable: bool = False,
        auto_delete: bool = False,
        passive: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> Exchange: ...

    async def get_exchange(self, name: str, *, ensure: bool = True) -> Exchange: ...

    async def declare_queue(
        self,
        name: str | None = None,
        *,
        durable: bool = False,
        exclusive: bool = False,
        passive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> Queue: ...

    async def set_qos(self, prefetch_count: int = 0) -> object: ...

    @property
    def default_exchange(self) -> Exchange: ...

    def close(self, exc: BaseException | None = None) -> Awaitable[object]: ...


class Connection(Protocol):
    @property
    def close_callbacks(self) -> CloseCallbacks: ...

    @property
    def is_closed(self) -> bool: ...

    # aio-pika returns an awaitable channel object, the in-memory broker a coroutine: both are awaited.
    def channel(
        self, channel_number: int | None = None, publisher_confirms: bool = True, on_return_raises: bool = False
    ) -> Awaitable[Channel]: ...

    def close(self, exc: BaseException | None = None) -> Awaitable[object]: ...


class Connect(Protocol):
    """Open a connection to ``url``; ``timeout`` bounds the attempt. Raise OSError/TimeoutError if down."""

    def __call__(self, url: str, *, timeout: float) -> Awaitable[Connection]: ...


_TRANSPORTS: dict[str, Connect] = {}


def register_transport(scheme: str, connect: Connect) -> None:
    """Make ``scheme://`` URLs connect with ``connect`` (re-registering a scheme replaces it)."""
    _TRANSPORTS[scheme.lower()] = connect


def registered_schemes() -> list[str]:
    return sorted(_TRANSPORTS)


class UnknownTransport(ValueError):
    """A broker URL whose scheme no transport is registered for."""


def transport_for(url: str) -> Connect:
    scheme = urlsplit(url).scheme.lower()
    connect = _TRANSPORTS.get(scheme)
    if connect is None:
        hint = " (memory:// is registered by `import qbroker.testing`)" if scheme == "memory" else ""
        raise UnknownTransport(
            f"no transport for URL scheme {scheme or '(none)'!r}{hint}; registered: {', '.join(registered_schemes())}"
        )
    return connect


async def _connect_amqp(url: str, *, timeout: float) -> Connection:
    connection: Connection = await connect_amqp(url, timeout=timeout)
    return connection


register_transport("amqp", _connect_amqp)
register_transport("amqps", _connect_amqp)
