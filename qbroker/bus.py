"""The bus under a unit: one connection, the four exchanges, the reply queue, publishing and replies.

This is everything ``rpc``, ``alerts`` and ``dead_letter`` need of a unit (FastStream's broker config,
Nameko's publisher) and nothing more: make a message, publish it, send a reply, wait until connected,
the replies in flight, register a consumer. The ``Unit`` owns one and builds its endpoints and
listeners on top, so a request goes straight down: unit -> rpc -> bus -> envelope -> codecs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from aio_pika.abc import AbstractIncomingMessage
from aio_pika.exceptions import ChannelNotFoundEntity
from aiormq.exceptions import DeliveryError
from structlog.typing import FilteringBoundLogger

from qbroker.amqp_properties import copy_headers
from qbroker.codecs import CodecError
from qbroker.config import Config
from qbroker.connection import ConnectionSupervisor
from qbroker.envelope import (
    DEBUG_INFO_HEADER,
    SENDER_HEADER,
    MessageKind,
    OutgoingMessage,
    build_message,
    new_message_id,
    trusted_sender,
)
from qbroker.errors import BadMessage, ConnectionLost, ErrorInfo, InternalError, ReplyTooLarge, RequestError
from qbroker.exchanges import declare_unit_queue, ensure_topology
from qbroker.guaranteed import GuaranteedRequests
from qbroker.middleware import MiddlewareStack
from qbroker.original_dialect import ForOriginal, for_original
from qbroker.publish_channels import PublishChannels, Role
from qbroker.replies import PendingReplies, Reply, failed_reply, parse_reply
from qbroker.transport import Channel, Connection, Consumer, Queue

OnConnected = Callable[[Connection], Awaitable[None]]


class Bus:
    """One unit's connection to the broker and the operations on it that everything above shares."""

    def __init__(
        self, config: Config, *, app: str, uuid: str, log: FilteringBoundLogger, on_connected: OnConnected
    ) -> None:
        self.config = config
        self.app = app
        self.uuid = uuid
        self.log = log
        self.pending = PendingReplies(config.unreadable_reply_grace)
        # The guaranteed requests this unit serves, so a second copy of one is not run twice.
        self.guaranteed = GuaranteedRequests(config.guaranteed_answers_kept, config.deadline_slack)
        # The middleware chains of this unit's endpoints and listeners, and its send hooks.
        self.middleware = MiddlewareStack()
        self.supervisor = ConnectionSupervisor(config, self._connected, self._lost, app=app, uuid=uuid)
        self._on_connected = on_connected
        self.publishing = PublishChannels(config, log, self.supervisor, lambda: self._serving)
        self._consumers: list[tuple[Queue, str]] = []
        # Between start() and stop_consuming(): a channel the broker closes under us means "reconnect".
        self._serving = False

    # -- connection -----------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.supervisor.start()
        self._serving = True

    async def stop_consuming(self) -> None:
        """Cancel every consumer: no new work arrives, work in hand carries on (and may still reply)."""
        self._serving = False
        for queue, tag in self._consumers:
            with contextlib.suppress(Exception):
                await queue.cancel(tag)
        self._consumers.clear()

    async def flush(self, timeout: float) -> None:
        """Wait until what this unit queued on the connection so far (replies, acks) is with the broker.

        Publishes and acks are queued on the connection, not awaited until written (docs/performance.md),
        and closing a connection drops what is still queued: a reply and its request's ack never sent, so
        the request would run again elsewhere. One round trip on the publishing channel (a no-op
        ``basic.qos``; that channel consumes nothing) comes back only after everything queued before it
        was written, in order, on the same socket. Never raises: at worst the stop is what a kill is."""
        publisher = self.publishing.channel
        if publisher is None or publisher.is_closed:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(publisher.set_qos(prefetch_count=0), timeout)

    async def close(self, reason: str) -> None:
        self._serving = False
        await self.supervisor.close()
        self.pending.fail_all(ConnectionLost(reason), keep_durable=False)

    @property
    def connection(self) -> Connection | None:
        return self.supervisor.connection

    async def wait_connected(self, timeout: float | None) -> bool:
        return await self.supervisor.wait_ready(timeout)

    async def _connected(self, connection: Connection) -> None:
        self._consumers = []
        channel = await connection.channel(publisher_confirms=True)
        await ensure_topology(connection, self.config, self.log, channel)
        exchanges = await self.publishing.open(connection, None if channel.is_closed else channel)
        self.publishing.exchanges = exchanges
        own = await self.channel(connection, confirms=False)
        reply_queue = await declare_unit_queue(own, self.config, "reply", self.uuid)
        await reply_queue.bind(exchanges.reply, routing_key=self.uuid)
        await reply_queue.consume(self._on_reply, no_ack=True)
        await self._on_connected(connection)

    async def _lost(self, exc: BaseException | None) -> None:
        self.publishing.lost()
        self.guaranteed.connection_lost()
        self.pending.fail_all(ConnectionLost("connection to the broker was lost; the request may be retried"))

    async def dead_letter_consumers(self) -> int | None:
        """Consumers on the ``dead`` queue (units collecting dead letters), or None if unknown."""
        return await self.queue_consumers(self.config.dead_queue_name)

    async def queue_consumers(self, queue_name: str) -> int | None:
        """Consumers on ``queue_name`` (0 if it does not exist), or None if unknown."""
        connection = self.connection
        if connection is None:
            return None
        try:
            # A throwaway channel: a passive declare of a missing queue closes the channel it runs on.
            channel = await connection.channel(publisher_confirms=False)
            try:
                queue = await channel.declare_queue(queue_name, passive=True)
                return int(queue.declaration_result.consumer_count)  # type: ignore[attr-defined]
            finally:
                with contextlib.suppress(Exception):
                    await channel.close()
        except ChannelNotFoundEntity:
            return 0
        except Exception:
            return None

    async def channel(self, connection: Connection, *, confirms: bool) -> Channel:
        """A channel whose closing by the broker (e.g. a declare conflict) rebuilds the whole connection."""
        channel = await connection.channel(publisher_confirms=confirms)

        def _channel_closed(_: object, exc: BaseException | None = None) -> None:
            # A half-wired unit is worse than a reconnect: start over on a fresh connection.
            if exc is not None and self._serving and not connection.is_closed:
                self.log.warning("channel closed by broker; reconnecting", error=repr(exc))
                self.supervisor.lose(exc)

        channel.close_callbacks.add(_channel_closed)
        return channel

    async def add_consumer(
        self, queue: Queue, consumer: Consumer, *, part: str, answer: bool = True, priority: int | None = None
    ) -> str:
        """Consume ``queue`` until stop_consuming() (or the connection ends), at consumer ``priority``.

        Whatever ``consumer`` raises, the message is settled (see ``settle_failed``), so no bug or
        forged message can hold a prefetch slot until the connection closes."""
        arguments = {"x-priority": priority} if priority is not None else None
        tag = await queue.consume(self.guarded(consumer, part=part, answer=answer), arguments=arguments)
        self._consumers.append((queue, tag))
        return tag

    async def cancel_consumer(self, queue: Queue, tag: str) -> None:
        """Stop one consumer (an endpoint removed at run time); its messages in hand may still be acked."""
        if (queue, tag) in self._consumers:
            self._consumers.remove((queue, tag))
            with contextlib.suppress(Exception):  # a closed channel cancelled it already
                await queue.cancel(tag)

    def guarded(self, consumer: Consumer, *, part: str, answer: bool = True) -> Consumer:
        async def guarded(message: AbstractIncomingMessage) -> None:
            try:
                await consumer(message)
            except Exception as exc:
                await self.settle_failed(message, exc, part=part, answer=answer)

        return guarded

    async def settle_failed(
        self, message: AbstractIncomingMessage, exc: BaseException, *, part: str, answer: bool = True
    ) -> None:
        """A consumer failed on ``message``: answer ``fail`` if it asks for a reply, then ack it."""
        if getattr(message, "processed", False):
            # Acked already (e.g. a detached request): its reply is the handler's business.
            self.log.warning(
                "message handling failed after ack",
                part=part,
                error=repr(exc),
                correlation_id=_text(message.message_id),
            )
            return
        self.log.error(
            "message handling failed; acking it", part=part, error=repr(exc), correlation_id=_text(message.message_id)
        )
        reply_to, message_id = message.reply_to, message.message_id
        if answer and isinstance(reply_to, str) and reply_to and isinstance(message_id, str) and message_id:
            error = InternalError(f"{part} could not process the message ({type(exc).__name__})")
            await self.send_reply(
                reply_to, message_id, None, error.to_info(part=part), part=part, original=for_original(message.headers)
            )
        with contextlib.suppress(Exception):  # a lost connection requeues it: nothing more to do
            await message.ack()

    async def _on_reply(self, message: AbstractIncomingMessage) -> None:
        try:
            reply = parse_reply(message, accept=self.config.accept, max_bytes=self.config.max_body_bytes)
        except Exception as exc:  # the reply consumer is no-ack: a caller may still be waiting for it
            self.log.warning("unreadable reply", error=repr(exc), correlation_id=_text(message.correlation_id))
            reply = failed_reply(message, InternalError(f"unreadable reply ({type(exc).__name__})"))
        if (message.headers or {}).get("notice") == "delivered":
            try:
                self.pending.delivered(reply)
            except Exception as exc:  # the caller's callback: its bug must not cost the reply that follows
                self.log.warning("delivered-notice callback failed", error=repr(exc))
            return
        self._deliver(reply, message)

    def _deliver(self, reply: Reply, message: AbstractIncomingMessage) -> None:
        if not self.pending.deliver(reply):
            self.log.debug("reply nobody waits for", correlation_id=_text(message.correlation_id))

    # -- publishing ---------------------------------------------------------------------------------

    def make_message(self, body: Any, *, kind: MessageKind, message_id: str, **fields: Any) -> OutgoingMessage:
        # user-id is the connection's own account: RabbitMQ checks it, so receivers may trust it.
        return build_message(
            body,
            kind=kind,
            app_id=self.uuid,
            app=self.app,
            message_id=message_id,
            user_id=self.supervisor.user,
            **fields,
        )

    async def publish(self, role: Role, routing_key: str, message: OutgoingMessage, *, confirm: bool = True) -> None:
        """Publish, refusing here what the broker would refuse by closing our shared channel. With
        ``confirm`` (always, but for replies) this returns once the broker has the message, else once it
        is written to the connection."""
        exchanges = await self.publishing.ready()
        self.check_size(message)
        await self.publishing.publish(exchanges, role, routing_key, message, confirm=confirm)

    def copy_message(
        self, message: AbstractIncomingMessage, headers: dict[str, Any], *, reply: bool = True, ttl: float | None = None
    ) -> OutgoingMessage:
        """A re-publishable copy of a received message with ``headers`` added. The broker refuses a user-id
        that is not our own account, so the copy carries ours, and the original sender's account travels
        in ``SENDER_HEADER``, which receivers believe only on a message from their own account
        (``trusted_sender``): anyone else could write that header."""
        extra = dict(headers)
        sender = trusted_sender(message, self.supervisor.user)
        if sender is not None:
            extra[SENDER_HEADER] = sender
        elif SENDER_HEADER in (message.headers or {}):
            extra[SENDER_HEADER] = ""  # a forged claim is not passed on as if we had vouched for it
        table = copy_headers(dict(message.headers or {}), extra)  # within a frame whatever the sender sent
        return OutgoingMessage(
            message.body,
            headers=table,
            content_type=message.content_type,
            content_encoding=message.content_encoding,
            app_id=message.app_id,
            message_id=message.message_id,
            reply_to=message.reply_to if reply else None,
            correlation_id=message.correlation_id,
            type=message.type,
            priority=message.priority,
            expiration=max(0.001, ttl) if ttl is not None else None,
            timestamp=message.timestamp,
            delivery_mode=message.delivery_mode or 1,
            user_id=self.supervisor.user,
        )

    def check_size(self, message: OutgoingMessage) -> None:
        """A body over the broker's max_message_size makes it close the channel, failing every publish
        in flight on it (and, through our reconnect, every call): refuse it before it leaves."""
        limit = self.config.max_body_bytes
        if len(message.body) > limit:
            raise BadMessage("too_large", f"message body of {len(message.body)} bytes exceeds the limit of {limit}")

    async def send_notice(self, reply_to: str, correlation_id: str | None, *, confirm: bool = False) -> None:
        """RQ DELIVERED: tell a caller that asked that its request reached this server. Never raises.
        ``confirm`` as for its reply, which must go on the same channel to arrive after it."""
        try:
            message = self.make_message(
                None, kind="reply", message_id=new_message_id(), correlation_id=correlation_id, notice="delivered"
            )
            await self.publish("reply", reply_to, message, confirm=confirm)
        except Exception as exc:  # only a notice: the reply itself still follows
            self.log.debug("delivered notice not sent", correlation_id=correlation_id, error=repr(exc))

    async def send_reply(
        self,
        reply_to: str,
        correlation_id: str | None,
        body: Any,
        error: ErrorInfo | None,
        *,
        debug: bool = False,
        confirm: bool = False,
        part: str = "qbroker.reply",
        original: ForOriginal | None = None,
        debug_info: dict[str, Any] | None = None,
    ) -> bool:
        """Publish one reply; never raises (a lost connection means the request is redelivered). Returns
        whether it went out: with ``confirm``, whether the broker confirmed it, after a few tries when the
        broker refuses it (a quorum reply queue electing a new leader after a node loss nacks meanwhile).
        ``part`` is named in an error made here; ``original``: the request was in the original QBroker's dialect.

        Unless ``confirm`` (a guaranteed request), the reply goes on the channel without confirms and
        this returns once it is written: the request's ack is written after it on the same connection,
        and RabbitMQ handles a connection's frames in order even when it closes, so a reply is not lost
        where a confirm would have saved it, except with the broker itself, whose transient reply
        queues die with it anyway. A confirm awaited per reply cost a broker round trip per request."""
        extra = {DEBUG_INFO_HEADER: debug_info} if debug_info is not None else None
        try:
            try:  # the hot path, inline: _reply() for the rare ones below
                message = self.make_message(
                    body,
                    kind="reply",
                    message_id=new_message_id(),
                    debug=debug,
                    correlation_id=correlation_id,
                    error=error,
                    extra_headers=extra,
                    error_extra=original.error_keys(error) if original and error else None,
                )
            except CodecError as exc:
                bad = RequestError("bad_result", "the handler's result cannot be encoded", detail=str(exc))
                message = self._reply(correlation_id, None, bad.to_info(part=part), debug, extra, original)
            if len(message.body) > self.config.max_body_bytes:
                big = ReplyTooLarge(
                    f"the reply of {len(message.body)} bytes exceeds the limit of {self.config.max_body_bytes} bytes"
                )
                self.log.warning(
                    "reply too large; answering with an error", correlation_id=correlation_id, size=len(message.body)
                )
                message = self._reply(correlation_id, None, big.to_info(part=part), debug, extra, original)
            tries = REPLY_CONFIRM_TRIES if confirm else 1
            for attempt in range(1, tries + 1):
                try:
                    await self.publish("reply", reply_to, message, confirm=confirm)
                    return True
                except DeliveryError:  # refused, not lost: the connection is still there
                    if attempt == tries:
                        raise
                    await asyncio.sleep(0.2 * 2**attempt)
        except Exception as exc:
            self.log.warning("reply not sent", correlation_id=correlation_id, error=str(exc) or type(exc).__name__)
        return False

    def _reply(
        self,
        correlation_id: str | None,
        body: Any,
        error: ErrorInfo | None,
        debug: bool,
        extra: dict[str, Any] | None,
        original: ForOriginal | None,
    ) -> OutgoingMessage:
        return self.make_message(
            body,
            kind="reply",
            message_id=new_message_id(),
            correlation_id=correlation_id,
            error=error,
            debug=debug,
            extra_headers=extra,
            error_extra=original.error_keys(error) if original and error else None,
        )


# A guaranteed request's reply the broker refuses is published again this often (waits of 0.4, 0.8, 1.6 s)
# before the request is handed back to its queue instead of acked (``rpc.serve_request``).
REPLY_CONFIRM_TRIES = 4


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
