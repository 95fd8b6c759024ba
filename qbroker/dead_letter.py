"""The dead-letter collector: answers dead RPC requests at once, logs dead alerts, counts both.

Requests reach the ``dead`` queue two ways: the ``rpc`` exchange's alternate exchange (no queue bound
for the name: nobody serves it) and the ``rpc_<name>`` queues' dead-letter exchange (the request's
expiration passed while it waited, or a server rejected it). The caller gets a reply either way, so a
call to a missing service fails in milliseconds instead of at its deadline.

What a dead message was is read from where it was published, never from the optional AMQP ``type``
(the protocol does not define it, so another client of the protocol leaves it out; docs/wire-format.md):
a message delivered from an exchange other than ``dead`` came through that exchange's alternate exchange,
and one dead-lettered by the broker names its original exchange in ``x-death``. Every header is untrusted: a
forged ``x-death`` of the wrong shape is treated as "unknown", never raises.

Every dead message that is not an alert (a request nobody served, one that expired in its queue, was rejected, or
was sent to ``dead`` as poison after exhausting its retries) is also copied, by the collector that took it, to the
``dead.kept.in`` exchange and the ``dead.kept`` queue, with where it was first published and why it died in
``x-qbroker-dead-*`` headers (docs/semantics.md, "Dead letters are kept"), for operators to list and replay
(``qbroker.dead_kept``, ``qbroker dead``). Alerts nobody listens to are only counted: they are many.

Run inside any unit with ``Config(dead_letters=True)``, or standalone: ``qbroker-dead-letter``
(``python -m qbroker.cli.dead_letter``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from aio_pika.abc import AbstractIncomingMessage

from qbroker.bus import Bus
from qbroker.config import Config
from qbroker.envelope import FAILURES, RETRIES, debug_info
from qbroker.errors import NoServer, QBrokerError, RequestError, RequestFailed, TimedOutInQueue
from qbroker.original_dialect import for_original
from qbroker.transport import Connection, Exchange

PART = "qbroker.dead_letter"
# Where a kept copy was first published and why it died (the copy itself is delivered from `dead.kept`).
KEPT_HEADERS = ("x-qbroker-dead-kind", "x-qbroker-dead-reason", "x-qbroker-dead-exchange", "x-qbroker-dead-name")
_MAX_TEXT = 256  # names and reasons from headers end up in logs and replies: keep them short
DeadLetterObserver = Callable[[str, QBrokerError], None]
"""Told (reason, error) for every dead request a collector answered; e.g. qbroker.metrics."""


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value[:_MAX_TEXT] if isinstance(value, str) else None


def _last_death(headers: Mapping[str, Any], config: Config) -> Mapping[str, Any] | None:
    """The broker's latest dead-lettering of the message (x-death lists the latest first), unless that was
    the end of a retry wait: a qbroker.retry.* queue dead-letters back to ``rpc``, never here, so such an
    entry is left over from a retry, carried on by a server that then sent the request here itself."""
    deaths = headers.get("x-death")
    if not (isinstance(deaths, list | tuple) and deaths and isinstance(deaths[0], Mapping)):
        return None
    queue = _text(deaths[0].get("queue")) or ""
    return None if queue.startswith(config.exchange_prefix + "qbroker.retry.") else deaths[0]


def kind_of_exchange(config: Config, exchange: str | None) -> str:
    """``rpc``, ``alert`` or ``reply`` for one of our exchanges, else ``unknown``."""
    for role in ("rpc", "alert", "reply"):
        if exchange == config.exchange_name(role):  # type: ignore[arg-type]
            return role
    return "unknown"


def classify(message: AbstractIncomingMessage, config: Config) -> tuple[str, str]:
    """(kind, reason) of a dead message, from where it was published; never raises."""
    exchange = _text(message.exchange) or ""
    if exchange != config.exchange_name("dead"):
        # Delivered from the exchange it was published to: it went through that exchange's
        # alternate exchange because no queue was bound for its routing key.
        return kind_of_exchange(config, exchange), "unroutable"
    headers = message.headers if isinstance(message.headers, Mapping) else {}
    death = _last_death(headers, config)
    if death is None:  # published straight to `dead`: by a server, a request out of deliveries or retries
        if FAILURES in headers:
            return "rpc", "poison"
        if RETRIES in headers:
            return "rpc", "retries_exhausted"
        return "unknown", "unknown"
    return kind_of_exchange(config, _text(death.get("exchange"))), _text(death.get("reason")) or "unknown"


def error_for(name: str, reason: str) -> QBrokerError:
    if reason == "unroutable":
        return NoServer(f"no server for {name}")
    if reason == "expired":
        return TimedOutInQueue(f"request {name} timed out waiting in its queue")
    if reason == "rejected":
        return RequestFailed("rejected", "the request was rejected by its server", detail=name)
    # One message for the id (docs/wire-format.md, "Error element"); the request's name and the broker's
    # reason are the detail.
    return RequestError("dead_letter", "the request was dead-lettered", detail=f"{name} ({reason})")


class DeadLetterCollector:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.counts: Counter[str] = Counter()
        self.log = bus.log.bind(part=PART)
        self._kept: Exchange | None = None
        self.observers: list[DeadLetterObserver] = []

    async def attach(self, connection: Connection) -> None:
        channel = await self.bus.channel(connection, confirms=False)
        await channel.set_qos(prefetch_count=256)
        # The bus found both at connect (qbroker.topology_check); a queue gone since closes this channel,
        # which reconnects and finds them again.
        queue = await channel.declare_queue(self.bus.config.dead_queue_name, passive=True)
        self._kept = await channel.get_exchange(self.bus.config.dead_kept_exchange_name, ensure=False)
        await self.bus.add_consumer(queue, self._on_dead, part=PART)

    async def _on_dead(self, message: AbstractIncomingMessage) -> None:
        kind, reason = classify(message, self.bus.config)
        # The routing key is the request's name (the protocol: headers.name matches it), and unlike a header
        # it is always a string.
        name = _text(message.routing_key) or "?"
        self.counts[f"{kind}.{reason}"] += 1
        log = self.log.bind(name=name, correlation_id=message.message_id, reason=reason, kind=kind)
        if kind == "rpc" and message.reply_to and message.message_id:
            error = error_for(name, reason)
            headers = message.headers if isinstance(message.headers, Mapping) else {}
            debug = bool(headers.get("debug"))
            info = debug_info(self.bus.app, self.bus.uuid, PART, kind=kind, reason=reason) if debug else None
            # The original QBroker reads this as its own collector's answer (original_dialect).
            original = for_original(headers, (self._origin(message), name))
            await self.bus.send_reply(
                message.reply_to,
                message.message_id,
                None,
                error.to_info(part=PART),
                debug=debug,
                part=PART,
                original=original,
                debug_info=info,
            )
            log.info("answered dead request", status=error.status, error=error.id)
            for observe in self.observers:
                try:
                    observe(reason, error)
                except Exception:  # an observer's bug must not cost the dead message its ack
                    log.exception("dead letter observer failed")
        elif kind == "alert":
            log.debug("alert nobody listens to") if reason == "unroutable" else log.info("dead alert")
        else:
            log.info("dead message")
        if kind != "alert":
            await self._keep(message, kind, reason, name)
        await message.ack()

    def _origin(self, message: AbstractIncomingMessage) -> str:
        """The exchange a dead message was published to (a dead-lettered one names it in ``x-death``)."""
        exchange = _text(message.exchange) or ""
        if exchange != self.bus.config.exchange_name("dead"):
            return exchange
        headers = message.headers if isinstance(message.headers, Mapping) else {}
        death = _last_death(headers, self.bus.config) or {}
        return _text(death.get("exchange")) or exchange

    async def _keep(self, message: AbstractIncomingMessage, kind: str, reason: str, name: str) -> None:
        """The copy for operators; never costs the dead message its ack."""
        origin = _text(message.exchange) or ""
        if origin == self.bus.config.exchange_name("dead"):  # dead-lettered: x-death names the origin
            received = message.headers if isinstance(message.headers, Mapping) else {}
            death = _last_death(received, self.bus.config) or {}
            # none: a server sent it here, out of deliveries or retries (its name is the routing key)
            origin = _text(death.get("exchange")) or (self.bus.config.exchange_name("rpc") if kind == "rpc" else "")
            keys = death.get("routing-keys")
            name = (_text(keys[0]) if isinstance(keys, list | tuple) and keys else None) or name
        headers = dict(zip(KEPT_HEADERS, (kind, reason, origin, name), strict=True))
        try:
            if self._kept is None:
                raise RuntimeError("dead.kept not declared")
            await self._kept.publish(self.bus.copy_message(message, headers), routing_key=name)
            self.counts["kept"] += 1
        except Exception as exc:
            self.counts["kept_failed"] += 1
            self.log.warning("dead message not kept", name=name, error=repr(exc))

    def stats(self) -> dict[str, Any]:
        return dict(sorted(self.counts.items()))
