"""RPC: serving requests from ``rpc_<name>`` with exactly one reply each, and calling with deadlines."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from aio_pika.abc import AbstractIncomingMessage

from qbroker.bus import Bus, trusted_sender
from qbroker.codecs import CodecError
from qbroker.context import RequestContext
from qbroker.endpoints import Endpoint
from qbroker.envelope import JSON, Header, new_message_id, read_body, read_header
from qbroker.errors import (
    CallTimeout,
    ConnectionLost,
    DeadlinePassed,
    ErrorInfo,
    PoisonRequest,
    QBrokerError,
    RequestError,
)
from qbroker.handlers import run_handler
from qbroker.replies import Reply


def _expiration(timeout: float) -> float:
    """How long a request may wait in its queue: a little less than the caller waits, so the
    dead-letter path answers "timed out in queue" before the caller gives up on its own."""
    return max(0.05, timeout - min(0.25 * timeout, 1.0))


async def serve_request(bus: Bus, endpoint: Endpoint, message: AbstractIncomingMessage) -> None:
    """Handle one request from ``rpc_<endpoint>`` and send exactly one reply."""
    reply_to = message.reply_to
    # A guaranteed (persistent) request's notice and reply are confirmed before the request is acked.
    guaranteed = message.delivery_mode == 2
    ctx: RequestContext | None = None
    try:
        # No reply-to is a one-way request (RQ NOREPLY, EventMQ reply-requested=false): run it anyway.
        header = read_header(message, require=("message_id", "name"))
        if message.redelivered and await _count_failure(bus, endpoint, message, header):
            return  # re-queued with its failure count; that copy gets the one reply
        if header.deadline is not None and time.time() > header.deadline + bus.config.deadline_slack:
            # The caller has given up: running it would only do work nobody waits for.
            raise DeadlinePassed(f"request {endpoint.name} reached its server after its deadline; not run")
        own = endpoint.options.max_body_bytes
        limit = bus.config.max_body_bytes if own is None else min(own, bus.config.max_body_bytes)
        body = read_body(message, accept=bus.config.accept, max_bytes=limit)
        if reply_to and (message.headers or {}).get("notify") == "delivered":
            await bus.send_notice(reply_to, message.message_id, confirm=guaranteed)
        # A redelivered request re-published by a server of our account keeps its first sender's account.
        sender = trusted_sender(message, bus.supervisor.user)
        if sender != header.user_id:
            header = header.model_copy(update={"user_id": sender})
        ctx = RequestContext(header=header, kind="rpc", logger=bus.log, message=message)
        result, error = await run_handler(endpoint.dispatch, body, ctx, endpoint.name,
                                          endpoint.options.timeout, bus.handler_observers)
        # EventMQ retry-count: status "error" may pass on another try (perhaps on another server); "fail"
        # never does. The count travels on the message; the message waits in the broker, not here.
        if error is not None and error.status == "error" and not ctx.detached and endpoint.options.retries:
            tries = retries_of(message)
            if tries < endpoint.options.retries and await _retry_later(bus, endpoint, message, tries + 1, error):
                await message.ack()
                return
            if tries >= endpoint.options.retries:
                await _record_exhausted(bus, endpoint, message, tries)
    except QBrokerError as exc:
        bus.log.warning("request refused", name=endpoint.name, correlation_id=message.message_id,
                         error=str(exc))
        result, error = None, exc.to_info(part=endpoint.name)
    debug = ctx.debug if ctx is not None else False
    if reply_to:
        await bus.send_reply(reply_to, message.message_id, result, error, debug=debug, confirm=guaranteed)
    elif error is not None:
        bus.log.warning("one-way request failed", name=endpoint.name, correlation_id=message.message_id,
                         error=error.message)
    if ctx is None or not ctx.detached:
        await message.ack()


FAILURES = "x-qbroker-failures"
RETRIES = "x-qbroker-retries"


def retries_of(message: AbstractIncomingMessage) -> int:
    raw = (message.headers or {}).get(RETRIES, 0)
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0 else 0


def retry_delay_ms(first_delay: float, attempt: int) -> int:
    """Exponential backoff from the endpoint's ``retry_delay``, at most 5 minutes (one delay queue a step)."""
    return max(1, min(round(first_delay * 1000 * 2 ** (attempt - 1)), 300_000))


async def _retry_later(bus: Bus, endpoint: Endpoint, message: AbstractIncomingMessage, attempt: int,
                       error: ErrorInfo) -> bool:
    """Park a copy (with its try count) in ``qbroker.retry.<name>.<ms>``, a queue whose TTL dead-letters it
    back to ``rpc`` with the routing key ``<name>`` after the backoff: any server of the name may take it,
    and it survives this server's death. False if it could not be parked (then the caller gets the error).

    The copy goes through the ``rpc`` exchange (routing key ``qbroker.retry.<ms>.<name>``, bound to that
    queue), not the default exchange: a server's topic permissions can then allow exactly its own names."""
    connection = bus.connection
    if connection is None:
        return False
    delay = retry_delay_ms(endpoint.options.retry_delay, attempt)
    queue_name = f"{bus.config.exchange_prefix}qbroker.retry.{endpoint.name}.{delay}"
    routing_key = f"qbroker.retry.{delay}.{endpoint.name}"
    try:
        channel = await connection.channel(publisher_confirms=False)
        try:
            queue = await channel.declare_queue(queue_name, durable=True, arguments={
                "x-message-ttl": delay, "x-dead-letter-exchange": bus.config.exchange_name("rpc"),
                "x-dead-letter-routing-key": endpoint.name,
                "x-expires": max(600_000, 10 * delay),  # unused delay queues go away by themselves
            })
            await queue.bind(bus.config.exchange_name("rpc"), routing_key=routing_key)
        finally:
            with contextlib.suppress(Exception):
                await channel.close()
        await bus.publish("rpc", routing_key, bus.copy_message(message, {RETRIES: attempt}))
    except Exception as exc:
        bus.log.warning("retry not scheduled; answering the error", name=endpoint.name, error=repr(exc))
        return False
    bus.log.info("retry scheduled", name=endpoint.name, correlation_id=message.message_id, attempt=attempt,
                 delay_ms=delay, error=error.message)
    return True


async def _record_exhausted(bus: Bus, endpoint: Endpoint, message: AbstractIncomingMessage, tries: int) -> None:
    """The last try failed too: the caller gets this error, and ``dead`` keeps a copy (without reply-to,
    so nobody answers it twice) for whoever inspects what failed."""
    with contextlib.suppress(Exception):
        await bus.publish("dead", endpoint.name, bus.copy_message(message, {RETRIES: tries}, reply=False))


async def _count_failure(bus: Bus, endpoint: Endpoint, message: AbstractIncomingMessage, header: Header) -> bool:
    """A redelivered request: the delivery before ended without an answer (its server crashed, hung
    until the broker dropped it, or was killed). Classic queues only flag a redelivery, so the count
    travels in a header of a re-published copy; at ``max_redeliveries`` the request is poison: a copy
    goes to ``dead`` and PoisonRequest is raised for the caller instead of handing it to the next server.

    True when the request was re-queued (ack the original, do not run it)."""
    raw = (message.headers or {}).get(FAILURES, 0)
    failures = (raw if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0 else 0) + 1
    remaining = header.deadline - time.time() if header.deadline is not None else None
    if failures >= bus.config.max_redeliveries:
        await bus.publish("dead", endpoint.name, bus.copy_message(message, {FAILURES: failures}, reply=False))
        raise PoisonRequest(f"request {endpoint.name} ended {failures} deliveries without an answer (server "
                            "crashed, hung or was killed); sent to dead instead of retrying")
    if remaining is not None and remaining <= 0:
        return False  # the deadline check answers it
    bus.log.warning("redelivered request re-queued with its failure count", name=endpoint.name,
                    correlation_id=header.message_id, failures=failures)
    await bus.publish("rpc", endpoint.name, bus.copy_message(message, {FAILURES: failures}, ttl=remaining))
    await message.ack()
    return True


def _publish_failed(publish: asyncio.Future[None], future: asyncio.Future[Reply], name: str) -> None:
    if publish.cancelled() or future.done():
        return
    exc = publish.exception()
    if isinstance(exc, QBrokerError):
        future.set_exception(exc)
    elif exc is not None:
        future.set_exception(ConnectionLost(f"request to {name} was not accepted by the broker: {exc}"))


def _expire(future: asyncio.Future[Reply], name: str, timeout: float) -> None:
    if not future.done():
        future.set_exception(CallTimeout(f"no reply from {name} within {timeout}s"))


async def call(bus: Bus, name: str, body: Any, *, timeout: float, debug: bool = False,
               priority: int | None = None, content_type: str = JSON, guarantee: bool = False,
               on_delivered: Callable[[Reply], object] | None = None) -> Reply:
    """Publish one request and wait for its reply (which may carry an error element).

    ``guarantee`` (EventMQ): the request is persistent and the call keeps waiting across a lost
    connection, so a request the broker holds through its restart is processed and answered once both
    sides are back (at least once: the handler may run twice if its server dies mid-request)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    if not await bus.wait_connected(timeout):
        raise ConnectionLost(f"not connected to a broker within {timeout}s (calling {name})")
    message_id = new_message_id()
    future = bus.pending.expect(message_id, durable=guarantee, on_delivered=on_delivered)
    try:
        try:
            message = bus.make_message(
                body, kind="rpc", name=name, message_id=message_id, reply_to=bus.uuid, debug=debug,
                content_type=content_type, deadline=time.time() + timeout,
                expiration_s=_expiration(timeout), priority=priority, persistent=guarantee,
                notify=on_delivered is not None,
            )
        except CodecError as exc:
            raise RequestError("bad_request_body", f"cannot encode request for {name}: {exc}") from exc
        bus.check_size(message)  # what the broker would refuse fails this call only, here
        # Pipelined confirm: the reply normally arrives before the broker's ack; a refused or failed
        # publish resolves the call instead. One timer handle, no extra tasks: this is the hot path.
        publish = asyncio.ensure_future(bus.publish("rpc", name, message))
        publish.add_done_callback(lambda done: _publish_failed(done, future, name))
        timer = loop.call_at(deadline, _expire, future, name, timeout)
        try:
            reply = await future
        finally:
            timer.cancel()
    finally:
        bus.pending.forget(message_id)
    return reply


async def explain_timeout(bus: Bus, exc: CallTimeout) -> CallTimeout:
    """A bare timeout hides the likeliest cause when nobody collects dead letters: say so."""
    if await bus.dead_letter_consumers() != 0:
        return exc
    queue = bus.config.dead_queue_name
    return CallTimeout(f"{exc.message}; nobody on the bus collects dead letters (no consumer on queue "
                       f"{queue!r}), so a missing or stopped server cannot be reported: run "
                       "qbroker-dead-letter or a unit with dead_letters=True", part=exc.part)
