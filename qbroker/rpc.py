"""RPC: serving requests from ``rpc_<name>`` with exactly one reply each, and calling with deadlines."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import Any

from aio_pika.abc import AbstractIncomingMessage
from aio_pika.exceptions import AMQPError, ChannelInvalidStateError
from aiormq.exceptions import DeliveryError

from qbroker.bus import Bus, trusted_sender
from qbroker.codecs import CodecError
from qbroker.context import RequestContext
from qbroker.endpoints import Endpoint
from qbroker.envelope import JSON, OutgoingMessage, debug_info, new_message_id, read_body, read_header
from qbroker.errors import BadMessage, CallTimeout, ConnectionLost, QBrokerError, RequestError
from qbroker.guaranteed import request_key
from qbroker.handlers import run_handler
from qbroker.middleware import Next, Outcome
from qbroker.original_dialect import for_original
from qbroker.replies import Reply
from qbroker.request_middleware import request_builtins

# A guaranteed request the broker refuses (nacks) is published again after 0.4, 0.8, 1.6, then every 2 s; one
# lost before its confirm, after 0.1, 0.2, ... up to 2 s and once connected again.
PUBLISH_AGAIN_WAIT_MAX = 2.0


def _expiration(timeout: float) -> float:
    """How long a request may wait in its queue: a little less than the caller waits, so the
    dead-letter path answers "timed out in queue" before the caller gives up on its own."""
    return max(0.05, timeout - min(0.25 * timeout, 1.0))


async def serve_request(bus: Bus, endpoint: Endpoint, message: AbstractIncomingMessage) -> None:
    """Handle one request from ``rpc_<endpoint>`` through the endpoint's middleware chain (built-ins and
    the unit's, see ``qbroker.middleware``) and send exactly one reply."""
    reply_to = message.reply_to
    guaranteed = message.delivery_mode == 2
    ctx: RequestContext | None = None
    started = 0.0
    try:
        # No reply-to is a one-way request (RQ NOREPLY, EventMQ reply-requested=false): run it anyway.
        header = read_header(message, require=("message_id", "name"))
        if header.name != endpoint.name and not endpoint.serves(header.name):
            raise BadMessage(
                "bad_header",
                f"header name {header.name!r} does not match the routing key "
                f"{endpoint.name!r} the request was served under",
            )
        own = endpoint.options.max_body_bytes
        limit = bus.config.max_body_bytes if own is None else min(own, bus.config.max_body_bytes)
        body = read_body(message, accept=bus.config.accept, max_bytes=limit)
        # A redelivered request re-published by a server of our account keeps its first sender's account.
        sender = trusted_sender(message, bus.supervisor.user)
        if sender != header.user_id:
            header = header.model_copy(update={"user_id": sender})
        ctx = RequestContext(header=header, kind="rpc", logger=bus.log, message=message, part=endpoint.name)
        cache = endpoint.chain
        chain = (
            cache.chain
            if cache.version == bus.middleware.version
            else cache.set(bus.middleware, _build_chain(bus, endpoint))
        )
        if header.debug:
            started = time.perf_counter()
        if guaranteed:
            outcome = await _serve_once(bus, endpoint.name, message, ctx, body, chain)
            if outcome is None:
                return
            result, error = outcome
        else:
            result, error = await chain(ctx, body)
        if ctx.handed_on:  # a re-published copy (a retry, a redelivery count) gets the one reply
            if not ctx.detached:
                try:
                    await message.ack()
                except ChannelInvalidStateError:
                    _settled_by_redelivery(bus, message)
            return
    except QBrokerError as exc:
        bus.log.warning("request refused", name=endpoint.name, correlation_id=message.message_id, error=str(exc))
        result, error = None, exc.to_info(part=endpoint.name)
        if ctx is None:  # never reached the chain: the middlewares have not seen it
            bus.middleware.tell_refused(endpoint.name, "rpc", error, bus.log)
    # A refused request's header may be unreadable: its debug flag is taken as it came.
    debug = ctx.debug if ctx is not None else bool((message.headers or {}).get("debug"))
    sent = True
    if reply_to:
        info = _debug_info(bus, endpoint.name, message, started) if debug else None
        # A guaranteed (persistent) request's reply is confirmed before the request is acked.
        headers = message.headers or {}
        original = None if "name" in headers else for_original(headers)  # a qbroker request names itself
        sent = await bus.send_reply(
            reply_to,
            message.message_id,
            result,
            error,
            debug=debug,
            confirm=guaranteed,
            part=endpoint.name,
            original=original,
            debug_info=info,
        )
    elif error is not None:
        bus.log.warning(
            "one-way request failed", name=endpoint.name, correlation_id=message.message_id, error=error.message
        )
    if ctx is None or not ctx.detached:
        try:
            if guaranteed and not sent:
                # Its answer is lost: back to the queue, to be served (and answered) again: at least once.
                await message.nack(requeue=True)
            else:
                await message.ack()
        except ChannelInvalidStateError:
            _settled_by_redelivery(bus, message)


def _settled_by_redelivery(bus: Bus, message: AbstractIncomingMessage) -> None:
    """The served request's channel closed before it could be acked (the connection was lost): the broker
    delivers it again and that delivery is answered. The error must not reach the consumer's guard
    (``Bus.settle_failed``), whose ``internal_error`` would be a second reply."""
    bus.log.info(
        "request's channel closed before it was settled; the broker delivers it again",
        correlation_id=message.message_id,
    )


async def _serve_once(
    bus: Bus, name: str, message: AbstractIncomingMessage, ctx: RequestContext, body: Any, chain: Next
) -> Outcome | None:
    """Run a guaranteed request's chain once in this unit however many copies of it arrive (``qbroker.guaranteed``):
    a copy waits for the run in progress, then takes its outcome. The outcome to answer with, or None when this
    delivery went with its connection (the broker delivers it again)."""
    header = ctx.header
    key = request_key(
        name, header.message_id or "", header.user_id, message.reply_to, message.content_type, message.body
    )
    ledger = bus.guaranteed
    while (kept := ledger.kept(key)) is None and (running := ledger.running(key)) is not None:
        connection = bus.connection
        await running
        if bus.connection is not connection:
            return None
    if kept is not None:
        ctx.log.info("copy of a guaranteed request answered again, without running it again")
        return kept
    token = ledger.start(key)
    outcome: Outcome | None = None
    try:
        result, error = await chain(ctx, body)
        if not ctx.handed_on:
            outcome = result, error
        return result, error
    finally:
        ledger.finish(key, token, outcome, header.deadline)


def _debug_info(bus: Bus, part: str, message: AbstractIncomingMessage, started: float) -> dict[str, Any]:
    facts: dict[str, Any] = {"redelivered": bool(message.redelivered)}
    if started:  # it reached the handler: how long the chain (middlewares and handler) took
        facts["handler_us"] = round((time.perf_counter() - started) * 1e6)
    return debug_info(bus.app, bus.uuid, part, **facts)


def _build_chain(bus: Bus, endpoint: Endpoint) -> Next:
    run = functools.partial(run_handler, endpoint.dispatch, endpoint.name, endpoint.options.timeout)
    return bus.middleware.build(request_builtins(bus, endpoint), run)


def _publish_failed(publish: asyncio.Future[None], future: asyncio.Future[Reply], name: str) -> None:
    if publish.cancelled() or future.done():
        return
    exc = publish.exception()
    if isinstance(exc, QBrokerError):
        future.set_exception(exc)
    elif exc is not None:
        future.set_exception(ConnectionLost(f"request to {name} was not accepted by the broker: {exc}"))


async def publish_until_confirmed(
    bus: Bus, name: str, message: OutgoingMessage, *, until: float, expires_at: float
) -> None:
    """Publish a guaranteed request to ``rpc_<name>`` and return once the broker confirmed it.

    Lost before its confirm (the connection or the publishing channel closed: the broker may or may not have
    it), the same message, message id and all, is published again once connected, until ``until`` (loop
    time); its servers answer a second copy without running it twice (``qbroker.guaranteed``). Refused by the
    broker (a nack: a quorum queue electing its leader after a node died; the broker does not have it), it is
    published again with growing waits while the next try comes before ``until``, then the refusal is raised.
    What no retry changes (too large, forbidden) is raised at once. A copy queued expires at ``expires_at``
    (loop time), as the first would have."""
    loop = asyncio.get_running_loop()
    refusals = losses = 0
    while True:
        try:
            await bus.publish("rpc", name, message)
            return
        except DeliveryError:
            refusals += 1
            delay = min(0.2 * 2**refusals, PUBLISH_AGAIN_WAIT_MAX)
            if loop.time() + delay >= until:
                raise
        except Exception as exc:
            if not _lost_before_confirm(exc):
                raise
            losses += 1
            delay = min(0.05 * 2**losses, PUBLISH_AGAIN_WAIT_MAX)
            bus.log.warning(
                "guaranteed request not confirmed; publishing it again once connected",
                name=name,
                correlation_id=message.message_id,
                error=str(exc) or type(exc).__name__,
            )
        await asyncio.sleep(max(0.0, min(delay, until - loop.time())))
        if not await bus.wait_connected(until - loop.time()):
            raise ConnectionLost(f"not connected to a broker again before the deadline (calling {name})")
        message.user_id = bus.supervisor.user  # a failover URL may log in as another account
        message.expiration = max(0.05, expires_at - loop.time())


def _lost_before_confirm(exc: Exception) -> bool:
    """A publish that ended with its channel or connection (the broker may or may not have the message), not
    one refused for good. aiormq fails the confirms of a channel closed without an error with a bare Exception."""
    if isinstance(exc, QBrokerError):
        return isinstance(exc, ConnectionLost)
    return isinstance(exc, (AMQPError, ChannelInvalidStateError, OSError)) or type(exc) is Exception


def _expire(future: asyncio.Future[Reply], name: str, timeout: float) -> None:
    if not future.done():
        future.set_exception(CallTimeout(f"no reply from {name} within {timeout}s"))


async def call(
    bus: Bus,
    name: str,
    body: Any,
    *,
    timeout: float,
    debug: bool = False,
    priority: int | None = None,
    content_type: str = JSON,
    guarantee: bool = False,
    on_delivered: Callable[[Reply], object] | None = None,
    headers: dict[str, Any] | None = None,
    routing_key: str | None = None,
) -> Reply:
    """Publish one request and wait for its reply (which may carry an error element).

    ``guarantee`` (EventMQ): the request is persistent and the call keeps waiting across a lost
    connection, so a request the broker holds through its restart is processed and answered once both
    sides are back (at least once: the handler may run twice if its server dies mid-request).
    ``routing_key`` (default: the name) addresses a request elsewhere, as the original QBroker's discovery does
    (``qbroker.uuid.<uuid>``, docs/interop.md)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    if not await bus.wait_connected(timeout):
        raise ConnectionLost(f"not connected to a broker within {timeout}s (calling {name})")
    message_id = new_message_id()
    future = bus.pending.expect(message_id, durable=guarantee, on_delivered=on_delivered)
    try:
        try:
            message = bus.make_message(
                body,
                kind="rpc",
                name=name,
                message_id=message_id,
                reply_to=bus.uuid,
                debug=debug,
                content_type=content_type,
                deadline=time.time() + timeout,
                expiration_s=_expiration(timeout),
                priority=priority,
                persistent=guarantee,
                notify=on_delivered is not None,
                extra_headers=headers,
            )
        except CodecError as exc:
            raise RequestError("bad_request_body", f"cannot encode request for {name}: {exc}") from exc
        bus.check_size(message)  # what the broker would refuse fails this call only, here
        # Pipelined confirm: the reply normally arrives before the broker's ack; a refused or failed
        # publish resolves the call instead. One timer handle, no extra tasks: this is the hot path.
        if guarantee:
            publish = asyncio.ensure_future(
                publish_until_confirmed(
                    bus, routing_key or name, message, until=deadline, expires_at=loop.time() + _expiration(timeout)
                )
            )
        else:
            publish = asyncio.ensure_future(bus.publish("rpc", routing_key or name, message))
        publish.add_done_callback(lambda done: _publish_failed(done, future, name))
        timer = loop.call_at(deadline, _expire, future, name, timeout)
        try:
            reply = await future
        finally:
            timer.cancel()
            if guarantee:
                publish.cancel()  # answered or given up: never published again
    finally:
        bus.pending.forget(message_id)
    return reply


async def call_with_retries(
    bus: Bus, name: str, body: Any, *, timeout: float, retries: int, running: Callable[[], bool], **options: Any
) -> Reply:
    """``call``, again after a retryable error (up to ``retries`` times, while ``running()``); returns the
    reply (ok or warn, a warning logged), raises the remote error (error or fail). The unit's send hooks
    (``qbroker.middleware``) see one call, its retries included."""
    if not bus.middleware.senders:  # the hot path: no hooks to enter
        return await _call_with_retries(bus, name, body, timeout, retries, running, options)
    with bus.middleware.sending("call", name) as sending:
        reply = sending.reply = await _call_with_retries(
            bus, name, body, timeout, retries, running, {**options, "headers": sending.headers}
        )
        return reply


async def _call_with_retries(
    bus: Bus, name: str, body: Any, timeout: float, retries: int, running: Callable[[], bool], options: dict[str, Any]
) -> Reply:
    attempt = 0
    while True:
        try:
            reply = await call(bus, name, body, timeout=timeout, **options)
            reply.raise_for_status()
            if reply.warning is not None:
                bus.log.warning(
                    "call answered with a warning",
                    name=name,
                    warning=reply.warning.message,
                    correlation_id=reply.header.correlation_id,
                )
            return reply
        except QBrokerError as exc:
            if not exc.retryable or attempt >= retries or not running():
                if isinstance(exc, CallTimeout):
                    raise await explain_timeout(bus, exc) from None
                raise
            attempt += 1
            await asyncio.sleep(min(0.1 * 2**attempt, 2.0))


async def explain_timeout(bus: Bus, exc: CallTimeout) -> CallTimeout:
    """A bare timeout hides the likeliest cause when nobody collects dead letters: say so."""
    if await bus.dead_letter_consumers() != 0:
        return exc
    queue = bus.config.dead_queue_name
    return CallTimeout(
        f"{exc.message}; nobody on the bus collects dead letters (no consumer on queue "
        f"{queue!r}), so a missing or stopped server cannot be reported: run "
        "qbroker-dead-letter or a unit with dead_letters=True",
        part=exc.part,
    )
