"""How a unit answers "who is there": ``qbroker.ping`` under a guard, what it hears of ``qbroker.start`` and
``qbroker.stop``, and the addresses the original QBroker's discovery asks at.

A ping is answered under ``PingGuard`` (docs/security.md, "Ping reflection"): only to a uuid the pinging
account announced itself, and at a bounded rate per account. The original QBroker (docs/interop.md) also asks
on ``rpc``, addressing ``qbroker.uuid.<uuid>`` (one unit) or ``qbroker.app.<app>`` (the units of an app) with the
name it wants in the header: ``AddressedEndpoint`` answers those.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aio_pika.abc import AbstractIncomingMessage

from qbroker.alerts import Listener, topic_matches
from qbroker.bus import Bus
from qbroker.codecs import JSON
from qbroker.config import Config
from qbroker.context import RequestContext
from qbroker.endpoints import Endpoint, EndpointOptions
from qbroker.envelope import read_body
from qbroker.errors import NoServer, QBrokerError, RequestError
from qbroker.exchanges import declare_rpc_queue
from qbroker.transport import Connection

START, STOP, PING = "qbroker.start", "qbroker.stop", "qbroker.ping"
ANNOUNCEMENTS = (START, STOP)
# The original QBroker's discovery addresses (routing keys on ``rpc``; the wanted name is in the header).
UUID_ADDRESS, APP_ADDRESS = "qbroker.uuid.", "qbroker.app."
ADDRESS_PREFETCH = 16
ANNOUNCEMENT_MAX_BYTES = 256 * 1024  # a start or stop names a unit's endpoints and listeners: larger is not one
OnAddressed = Callable[[Endpoint, AbstractIncomingMessage], Awaitable[None]]


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


class PingGuard:
    """Which pings a unit answers. ``reply`` is a direct exchange: whoever names a uuid as reply-to gets the
    replies sent to that uuid's queue, and only ``user_id`` is checked by the broker. So a uuid belongs to the
    account that first announced it to this unit (by a ``qbroker.start`` naming it or a ping replying to it,
    with the account's broker-validated user-id): a ping is answered only to a uuid its own account holds,
    and each account gets ``burst`` answers, refilled at ``rate`` a second. On a bus with one shared account
    every uuid is that account's: only the rate applies."""

    def __init__(self, rate: float, burst: int, max_claims: int = 10_000) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.max_claims = max_claims
        self._claims: OrderedDict[str, str | None] = OrderedDict()  # uuid -> account, oldest use first
        self._buckets: OrderedDict[str | None, tuple[float, float]] = OrderedDict()  # account -> (tokens, at)
        self.refused = 0

    def claim(self, uuid: Any, user_id: str | None) -> bool:
        """``user_id`` announces ``uuid``: first claim wins. Whether the uuid is that account's now."""
        if not isinstance(uuid, str) or not uuid:
            return False
        owner = self._claims.setdefault(uuid, user_id)
        self._claims.move_to_end(uuid)
        while len(self._claims) > self.max_claims:
            self._claims.popitem(last=False)
        return owner == user_id

    def release(self, uuid: Any, user_id: str | None) -> None:
        """``qbroker.stop``: the account that holds ``uuid`` is done with it."""
        if isinstance(uuid, str) and uuid in self._claims and self._claims[uuid] == user_id:
            del self._claims[uuid]

    def take(self, user_id: str | None) -> bool:
        """One answer for ``user_id``'s account, if its rate allows."""
        now = time.monotonic()
        tokens, at = self._buckets.pop(user_id, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        allowed = tokens >= 1.0
        self._buckets[user_id] = (tokens - 1.0 if allowed else tokens, now)
        while len(self._buckets) > self.max_claims:
            self._buckets.popitem(last=False)
        if not allowed:
            self.refused += 1
        return allowed

    def answer_ping(self, reply_to: str | None, user_id: str | None) -> bool:
        if not reply_to or not self.take(user_id):
            return False
        if self.claim(reply_to, user_id):
            return True
        self.refused += 1
        return False


class AddressedEndpoint(Endpoint):
    """The unit's address on ``rpc`` for the original QBroker's discovery: ``qbroker.uuid.<uuid>`` (this unit) and
    ``qbroker.app.<app>`` (every unit of its app), on one exclusive queue of the unit's own. The request's header
    says what is asked: ``qbroker.ping`` is the unit's description; at the unit's own address, an endpoint's
    name runs that endpoint (the original's ``rpc(name, uuid=...)``). Every unit of an app hears the app's address,
    so there it answers pings only: an endpoint would run once per unit."""

    def __init__(
        self,
        app: str,
        uuid: str,
        describe_unit: Callable[[], dict[str, Any]],
        unit_endpoints: Mapping[str, Endpoint],
        guard: PingGuard,
    ) -> None:
        super().__init__(name=f"{UUID_ADDRESS}{uuid}", options=EndpointOptions(exclusive=True))
        self.app_address = f"{APP_ADDRESS}{app}"
        self.describe_unit = describe_unit
        self.unit_endpoints = unit_endpoints
        self.guard = guard

    def serves(self, name: str | None) -> bool:
        return True  # an address, not a name: the header says what is asked

    async def dispatch(self, body: Any, ctx: RequestContext) -> Any:
        name = ctx.name
        if name in (PING, self.name, self.app_address):
            if not self.guard.take(ctx.user_id):
                raise RequestError("ping_rate_limited", "too many pings from this account", part=self.name)
            return self.describe_unit()
        endpoint = self.unit_endpoints.get(name or "")
        via_app = ctx.message is not None and ctx.message.routing_key == self.app_address
        if endpoint is None or via_app:
            raise NoServer(f"no server for {name} at {ctx.message.routing_key if ctx.message else self.name}")
        return await endpoint.dispatch(body, ctx)


async def serve_address(
    bus: Bus, connection: Connection, address: AddressedEndpoint, on_addressed: OnAddressed
) -> None:
    """Consume the address's queue, bound with the unit's and its app's keys, on a channel of its own: where the
    broker refuses it (the account's permissions do not cover it), it closes that channel only and the address
    is not answered: the unit itself carries on (docs/interop.md)."""
    channel = await connection.channel(publisher_confirms=False)
    try:
        await channel.set_qos(prefetch_count=ADDRESS_PREFETCH)
        queue = await declare_rpc_queue(connection, channel, bus.config, address.name, log=bus.log, exclusive=True)
        await queue.bind(bus.config.exchange_name("rpc"), routing_key=address.app_address)
        consume: Callable[[AbstractIncomingMessage], Awaitable[None]] = functools.partial(on_addressed, address)
        await bus.add_consumer(queue, consume, part=address.name)
    except Exception as exc:  # refused: only this channel is closed
        bus.log.info(
            "not answering the original QBroker's discovery at the unit's address (refused by the broker)",
            address=address.name,
            error=repr(exc),
        )
        if not channel.is_closed:
            with contextlib.suppress(Exception):
                await channel.close()


async def hear_announcements(bus: Bus, connection: Connection, alert_queue: str) -> None:
    """Bind the unit's alert queue to ``qbroker.start`` and ``qbroker.stop`` (for the ping guard), on a channel
    of its own: an account that may not hear them (its role) loses that channel only, and its guard learns
    from pings alone."""
    channel = await connection.channel(publisher_confirms=False)
    try:
        queue = await channel.declare_queue(alert_queue, exclusive=True, auto_delete=True)  # as declare_unit_queue
        for name in (START, STOP):
            await queue.bind(bus.config.exchange_name("alert"), routing_key=name)
    except Exception as exc:  # refused: only this channel is closed
        bus.log.info("not hearing unit announcements (the account may not)", error=repr(exc))
    finally:
        if not channel.is_closed:
            with contextlib.suppress(Exception):
                await channel.close()


class Presence:
    """A unit's answers to "who is there": its ``qbroker.ping`` listener (under ``guard``), what it hears of
    ``qbroker.start`` / ``qbroker.stop`` (which account announced which uuid), and, with
    ``config.original_discovery``, its address for the original QBroker's discovery."""

    def __init__(
        self,
        app: str,
        uuid: str,
        describe: Callable[[], dict[str, Any]],
        endpoints: Mapping[str, Endpoint],
        config: Config,
    ) -> None:
        self.app = app
        self.uuid = uuid
        self.describe = describe
        self.guard = PingGuard(config.ping_rate, config.ping_burst)
        self.address = (
            AddressedEndpoint(app, uuid, describe, endpoints, self.guard) if config.original_discovery else None
        )

    async def answer(self, ctx: RequestContext, body: Any = None) -> dict[str, Any] | None:
        """The unit's description, to a ping that asks for it (the original's may name an ``app`` or a ``uuid``)
        and that the guard lets through; None: no reply."""
        if isinstance(body, Mapping) and (
            body.get("app", self.app) != self.app or body.get("uuid", self.uuid) != self.uuid
        ):
            return None
        return self.describe() if self.guard.answer_ping(ctx.reply_to, ctx.user_id) else None

    def heard(self, message: AbstractIncomingMessage, listeners: list[Listener]) -> bool:
        """``qbroker.start`` / ``qbroker.stop``: a unit's uuid is its account's from its start (first claim
        wins) until its stop. Returns True when no listener of ``listeners`` wants the message too."""
        with contextlib.suppress(QBrokerError):
            body = read_body(message, accept=[JSON], max_bytes=ANNOUNCEMENT_MAX_BYTES)
            if isinstance(body, Mapping):
                user_id = _text(getattr(message, "user_id", None))
                if message.routing_key == START:
                    self.guard.claim(body.get("uuid"), user_id)
                else:
                    self.guard.release(body.get("uuid"), user_id)
        name = message.routing_key or ""
        return not any(topic_matches(listener.pattern, name) for listener in listeners)

    async def attach(self, bus: Bus, connection: Connection, alert_queue: str, on_addressed: OnAddressed) -> None:
        """On every (re)connect: hear the announcements, consume the addresses."""
        # Each on a channel of its own, at once: a unit's start waits for the slower, not for both in turn.
        address = serve_address(bus, connection, self.address, on_addressed) if self.address is not None else None
        await asyncio.gather(hear_announcements(bus, connection, alert_queue), *([address] if address else []))
