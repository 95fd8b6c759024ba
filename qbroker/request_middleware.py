"""The built-in links of a request's middleware chain (order in ``qbroker.middleware``): poison counting,
deadlines, delivered notices and retries. They use only the bus's public surface, as a user's would."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from aio_pika.abc import AbstractIncomingMessage

from qbroker.bus import Bus
from qbroker.context import RequestContext
from qbroker.endpoints import Endpoint
from qbroker.envelope import FAILURES, RETRIES
from qbroker.errors import DeadlinePassed, PoisonRequest
from qbroker.middleware import Middleware, Next, Outcome, refuse


def _count(message: AbstractIncomingMessage, header: str) -> int:
    raw = (message.headers or {}).get(header, 0)
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0 else 0


def retries_of(message: AbstractIncomingMessage) -> int:
    return _count(message, RETRIES)


def retry_delay_ms(first_delay: float, attempt: int) -> int:
    """Exponential backoff from the endpoint's ``retry_delay``, at most 5 minutes (one delay queue a step)."""
    return max(1, min(round(first_delay * 1000 * 2 ** (attempt - 1)), 300_000))


class PoisonCount(Middleware):
    """A redelivered request: the delivery before ended without an answer (its server crashed, hung
    until the broker dropped it, or was killed). Classic queues only flag a redelivery, so the count
    travels in a header of a re-published copy; at ``max_redeliveries`` the request is poison: a copy
    goes to ``dead`` and the caller gets ``poison_request`` instead of the next server getting it."""

    def __init__(self, bus: Bus, endpoint: Endpoint) -> None:
        self.bus = bus
        self.name = endpoint.name

    async def handle(self, call_next: Next, ctx: RequestContext, body: Any) -> Outcome:
        message = ctx.message
        if message is None or not message.redelivered:
            return await call_next(ctx, body)
        bus, name = self.bus, self.name
        failures = _count(message, FAILURES) + 1
        remaining = ctx.deadline - time.time() if ctx.deadline is not None else None
        if failures >= bus.config.max_redeliveries:
            bus.log.warning("poison request sent to dead", name=name, correlation_id=ctx.message_id, failures=failures)
            await bus.publish("dead", name, bus.copy_message(message, {FAILURES: failures}, reply=False))
            return refuse(
                PoisonRequest(
                    f"request {name} ended {failures} deliveries without an answer (server "
                    "crashed, hung or was killed); sent to dead instead of retrying"
                ),
                name,
            )
        if remaining is not None and remaining <= 0:
            return await call_next(ctx, body)  # the deadline check answers it
        bus.log.warning(
            "redelivered request re-queued with its failure count",
            name=name,
            correlation_id=ctx.message_id,
            failures=failures,
        )
        await bus.publish("rpc", name, bus.copy_message(message, {FAILURES: failures}, ttl=remaining))
        ctx.handed_on = True
        return None, None


class Deadline(Middleware):
    """The caller has given up: running the request would only do work nobody waits for."""

    def __init__(self, bus: Bus, endpoint: Endpoint) -> None:
        self.slack = bus.config.deadline_slack
        self.name = endpoint.name

    async def handle(self, call_next: Next, ctx: RequestContext, body: Any) -> Outcome:
        deadline = ctx.header.deadline
        if deadline is not None and time.time() > deadline + self.slack:
            ctx.log.warning("request refused: past its deadline")
            return refuse(
                DeadlinePassed(f"request {self.name} reached its server after its deadline; not run"), self.name
            )
        return await call_next(ctx, body)


class DeliveredNotice(Middleware):
    """RQ DELIVERED: a caller that asked (header ``notify``) hears when a server picks its request up.
    A guaranteed (persistent) request's notice is confirmed before it goes on, as its reply will be."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    async def handle(self, call_next: Next, ctx: RequestContext, body: Any) -> Outcome:
        message = ctx.message
        if message is not None and message.reply_to and (message.headers or {}).get("notify") == "delivered":
            await self.bus.send_notice(message.reply_to, message.message_id, confirm=message.delivery_mode == 2)
        return await call_next(ctx, body)


class Retries(Middleware):
    """EventMQ retry-count: status ``error`` may pass on another try (perhaps on another server); ``fail``
    never does. The count travels on the message; the message waits in the broker, not here."""

    def __init__(self, bus: Bus, endpoint: Endpoint) -> None:
        self.bus = bus
        self.endpoint = endpoint

    async def handle(self, call_next: Next, ctx: RequestContext, body: Any) -> Outcome:
        result, error = await call_next(ctx, body)
        message, retries = ctx.message, self.endpoint.options.retries
        if error is None or error.status != "error" or ctx.detached or message is None:
            return result, error
        tries = retries_of(message)
        if tries < retries and await self._retry_later(message, tries + 1, error.message):
            ctx.handed_on = True
        elif tries >= retries:
            # The last try failed too: the caller gets this error, and ``dead`` keeps a copy (without
            # reply-to, so nobody answers it twice) for whoever inspects what failed.
            with contextlib.suppress(Exception):
                await self.bus.publish(
                    "dead", self.endpoint.name, self.bus.copy_message(message, {RETRIES: tries}, reply=False)
                )
        return result, error

    async def _retry_later(self, message: AbstractIncomingMessage, attempt: int, reason: str) -> bool:
        """Park a copy (with its try count) in ``qbroker.retry.<name>.<ms>``, a queue whose TTL dead-letters it
        back to ``rpc`` with the routing key ``<name>`` after the backoff: any server of the name may take it,
        and it survives this server's death. False if it could not be parked (then the caller gets the error).

        The copy goes through the ``rpc`` exchange (routing key ``qbroker.retry.<ms>.<name>``, bound to that
        queue), not the default exchange: a server's topic permissions can then allow exactly its own names."""
        bus, name = self.bus, self.endpoint.name
        connection = bus.connection
        if connection is None:
            return False
        delay = retry_delay_ms(self.endpoint.options.retry_delay, attempt)
        queue_name = f"{bus.config.exchange_prefix}qbroker.retry.{name}.{delay}"
        routing_key = f"qbroker.retry.{delay}.{name}"
        try:
            channel = await connection.channel(publisher_confirms=False)
            try:
                queue = await channel.declare_queue(
                    queue_name,
                    durable=True,
                    arguments={
                        "x-message-ttl": delay,
                        "x-dead-letter-exchange": bus.config.exchange_name("rpc"),
                        "x-dead-letter-routing-key": name,
                        "x-expires": max(600_000, 10 * delay),  # unused delay queues go away by themselves
                        **bus.config.durable_queue_type(),
                    },
                )
                await queue.bind(bus.config.exchange_name("rpc"), routing_key=routing_key)
            finally:
                with contextlib.suppress(Exception):
                    await channel.close()
            await bus.publish("rpc", routing_key, bus.copy_message(message, {RETRIES: attempt}))
        except Exception as exc:
            bus.log.warning("retry not scheduled; answering the error", name=name, error=repr(exc))
            return False
        bus.log.info(
            "retry scheduled",
            name=name,
            correlation_id=message.message_id,
            attempt=attempt,
            delay_ms=delay,
            error=reason,
        )
        return True


def request_builtins(bus: Bus, endpoint: Endpoint) -> list[Middleware]:
    """The built-in links of ``endpoint``'s chain, in their documented order."""
    links: list[Middleware] = [PoisonCount(bus, endpoint), Deadline(bus, endpoint), DeliveredNotice(bus)]
    if endpoint.options.retries:
        links.append(Retries(bus, endpoint))
    return links
