"""The TopOSM wire: JSON commands and expirations on the topic exchange ``osm`` (docs/tiles.md, "The TopOSM wire").

A client of the TopOSM protocol (docs/tiles.md, "The TopOSM protocol") publishes ``{"command": ...}`` on ``osm`` with
routing key ``toposm.queuemaster`` and a ``reply_to`` property, and expirations ``z/x/y;...`` with routing
key ``expire_toposm``. The queuemaster binds one durable queue to those keys (and to ``toposm``, where all
programs listen) and answers commands on the default exchange with routing key = ``reply_to`` and the
request's ``correlation_id`` (or ``message_id``) copied. Replies are the same JSON the qbroker endpoint
returns (both wires run the one command table in ``commands``); errors are
``{"command": <cmd>, "status": "fail"|"error", "error": <id>, "message": ..., "detail"?: ...}``.

Read as any program of the protocol may write: parameters we do not know are ignored (logged and
counted as ``osm_unknown_fields``), the ones we know validated as on the qbroker endpoint. Sent as strictly:
the protocol gives the render threads' own commands (``register``, ``rendered``, ``unregister``) no answer, so
theirs goes only to a sender that asks for one with a ``correlation_id`` (a failure is answered always).

The default exchange reaches any queue by name, past every topic permission: a command whose ``reply_to``
names one of the bus's own queues (``seed_wire.ReplyQueues``) is refused whole, with nothing published
anywhere (logged with the queue's kind and counted as ``osm_reply_to_refused``); any other queue is
answered. Render threads on this wire are never asked anything the protocol does not define: their liveness is
their queue's, asked of the broker (``osm_liveness``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, cast

import aio_pika
import orjson
import structlog
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange, AbstractIncomingMessage

from qbroker import BadMessage, ConnectionLost, ErrorInfo, HandlerCrashed, InvalidParams, QBrokerError
from qbroker.transport import Connection
from services.toposm.contract import ALL_PROGRAMS, EXPIRE_TOPIC, QUEUEMASTER, QUEUEMASTER_OSM_QUEUE, Command
from services.toposm.error_messages import errored, failed
from services.toposm.messages import RegisterRequest, RenderCommand
from services.toposm.seed_wire import ReplyQueues, declare_osm_exchange, known_params
from services.toposm.tilemath import Metatile

from .commands import COMMANDS, parse_command
from .osm_liveness import QueueLiveness, probe_queue
from .render_threads import RenderThread
from .state_machine import Queuemaster
from .waiter_store import WaiterStore

log = structlog.get_logger("toposm.osm_wire")
OSM_PART = QUEUEMASTER  # the error part: the same command table as the qbroker endpoint
BINDINGS = (QUEUEMASTER, EXPIRE_TOPIC, ALL_PROGRAMS)
# renderer -> queuemaster commands, to which the protocol gives no answer (see the module's docstring)
UNANSWERED_IN_SEED = frozenset({Command.REGISTER, Command.RENDERED, Command.UNREGISTER})


# Commands that wait for a render (`render`, `bulk`: minutes, and on this wire without a deadline) in progress
# at once: beyond this, answer `busy` instead of waiting one more, since the ack-first consumer's prefetch
# bounds nothing. The render threads' own commands (`register`, `rendered`: quick) are never shut out by
# them, or a client that fills the slots would stop every render, and its waits would never end: they get
# as many slots again, which only a flood of quick commands fills, for the moment it lasts.
MAX_COMMANDS = 1024


def error_result(command: Any, info: ErrorInfo) -> dict[str, Any]:
    """An error on the ``osm`` wire: the command, then the error element's fields, flat."""
    result = {"command": command, "status": info.status, "error": info.id, "message": info.message}
    if info.detail:
        result["detail"] = info.detail
    return result


# What to do with an expiry list heard here: (body, message id), from the service (both wires' expiries meet).
ExpiryHandler = Callable[[bytes, str | None], Awaitable[None]]


class OsmWire:
    def __init__(
        self,
        qm: Queuemaster,
        on_expiry: ExpiryHandler,
        *,
        max_body_bytes: int = 16 * 1024 * 1024,
        max_commands: int = MAX_COMMANDS,
        waiters: WaiterStore | None = None,
        queue_arguments: dict[str, Any] | None = None,
        reply_queues: ReplyQueues | None = None,
    ) -> None:
        self.qm = qm
        self.on_expiry = on_expiry
        self.waiters = waiters  # long-running commands (render) kept on disk until answered
        self.max_body_bytes = max_body_bytes  # the unit's limit: the osm wire is capped like the rest
        self.max_commands = max_commands
        self.queue_arguments = queue_arguments or {}  # a quorum queue where the unit's are (Config.queue_type)
        self.reply_queues = reply_queues or ReplyQueues()  # the unit's config: its prefix and dead queues
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._exchange: AbstractExchange | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._waiting = 0  # of the tasks, long-running commands (see MAX_COMMANDS)
        self._stopping = False

    async def declare(self, transport_connection: Connection) -> None:
        """on_connected hook: (re)declare the osm exchange and our queue, and consume it."""
        # The osm wire is plain AMQP (exchange flags, get_exchange, qos), beyond qbroker's narrow
        # transport protocol: it needs the aio-pika connection of an amqp:// unit.
        connection = cast(AbstractConnection, transport_connection)
        channel, exchange = await declare_osm_exchange(connection)
        await channel.set_qos(prefetch_count=256)
        # Durable, so expirations published while the queuemaster restarts wait for it.
        queue = await channel.declare_queue(QUEUEMASTER_OSM_QUEUE, durable=True, arguments=self.queue_arguments)
        for key in BINDINGS:
            await queue.bind(exchange, routing_key=key)
        self._connection, self._channel, self._exchange = connection, channel, exchange
        await queue.consume(self._on_message)

    async def stop(self) -> None:
        """Take no more messages from ``osm`` (unacked ones go back to the durable queue) and drop
        the commands in progress; their waiters were answered by the state machine already."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        if self._channel is not None and not self._channel.is_closed:
            await self._channel.close()

    async def publish_online(self) -> None:
        if self._exchange is None:
            return
        await self._exchange.publish(
            aio_pika.Message(
                orjson.dumps({"command": Command.QUEUEMASTER_ONLINE}),
                content_type="application/json",
                app_id=QUEUEMASTER,
            ),
            routing_key=ALL_PROGRAMS,
        )

    # -- render threads that speak the raw wire ------------------------------------------------------------

    async def _publish(self, routing_key: str, body: dict[str, Any], **properties: Any) -> None:
        if self._exchange is None:
            raise ConnectionLost("the osm exchange is not declared (not connected)")
        message = aio_pika.Message(
            orjson.dumps(body), content_type="application/json", reply_to=QUEUEMASTER_OSM_QUEUE, **properties
        )
        await self._exchange.publish(message, routing_key=routing_key)

    async def send_render(self, thread: RenderThread, metatile: Metatile) -> None:
        """The protocol's ``render`` on ``osm`` to the thread's own topic; its answer is a later ``rendered``."""
        await self._publish(thread.endpoint, RenderCommand(metatile=str(metatile)).body(), message_id=uuid.uuid4().hex)

    async def liveness(self, thread: RenderThread) -> QueueLiveness:
        """What the broker says about the thread's own queue (its ``reply_to``); nothing is sent to it."""
        if self._connection is None or self._connection.is_closed:
            raise ConnectionLost("the osm wire is not connected")
        if thread.reply_to is None:  # registration on this wire demands one: never the case
            return QueueLiveness.CONNECTED
        return await probe_queue(self._connection, thread.reply_to)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        if self._stopping:
            await message.nack(requeue=True)
            return
        # Ack first: a `render` may wait minutes, and every outcome is answered (or logged) below.
        await message.ack()
        bus_queue = self.reply_queues.bus_queue(message.reply_to) if message.reply_to else None
        if bus_queue is not None:
            # Answering would publish into the bus's own queue it names (dead, rpc_*, the queuemaster's).
            self.qm.stats.count("osm_reply_to_refused")
            log.warning(
                "osm message refused: reply_to names a queue of the bus",
                routing_key=message.routing_key,
                reply_to=message.reply_to[:128] if message.reply_to else None,
                queue_kind=bus_queue,
                correlation_id=message.correlation_id,
            )
            return
        size = len(message.body)
        if size > self.max_body_bytes:
            log.warning("osm message too large; dropped", routing_key=message.routing_key, size=size)
            error = failed("too_large", f"body of {size} bytes; the limit is {self.max_body_bytes}")
            await self._reply(message, error_result(None, error.to_info(part=OSM_PART)))
            return
        if message.routing_key == EXPIRE_TOPIC:
            try:
                await self.on_expiry(message.body, message.message_id)
            except Exception:  # never let one bad message kill the consumer
                log.exception("expiry on osm failed")
            return
        if len(self._tasks) >= 2 * self.max_commands:
            busy = errored("busy", f"{len(self._tasks)} osm commands in progress")
            await self._reply(message, error_result(None, busy.to_info(part=OSM_PART)))
            return
        task = asyncio.ensure_future(self._command(message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _command(self, message: AbstractIncomingMessage) -> None:
        command: Any = None
        try:
            try:
                body = orjson.loads(message.body)
            except orjson.JSONDecodeError as exc:
                raise BadMessage(f"body is not valid JSON: {exc}") from None
            if not isinstance(body, dict) or not isinstance(body.get("command"), str):
                raise InvalidParams("expected a JSON object with a string 'command' field")
            command = body.pop("command")
            if command == Command.QUEUEMASTER_ONLINE:
                return  # our own announcement, heard on `toposm`
            if command in COMMANDS:
                body = self._known_params(command, body, message)
            handler, request = parse_command(command, body)
            if isinstance(request, RegisterRequest) and message.reply_to is None:
                # The protocol: renderer -> queuemaster messages carry the renderer's queue as reply_to. Without
                # one we could neither reach the thread's answers nor tell whether it is still there.
                raise InvalidParams("register on the osm wire needs the render thread's queue as reply_to")
            if handler.long_running and self._waiting >= self.max_commands:
                raise errored("busy", f"{self._waiting} osm commands waiting for renders")
            # Acked already: a render in progress would be lost with a SIGKILL, so keep it until answered.
            stored = self._keep(handler.name, request, message) if handler.long_running else None
            self._waiting += handler.long_running
            try:
                # user_id is RabbitMQ-validated when set; a client that sets none is no renderer.
                result = await handler.run(self.qm, request, message.reply_to, message.user_id)
            finally:
                self._waiting -= handler.long_running
                if stored is not None and self.waiters is not None:
                    self.waiters.remove(stored)
            if isinstance(request, RegisterRequest):  # a render thread on the raw wire: reach it there
                thread = self.qm.threads.get(request.endpoint)
                if thread is not None:
                    thread.wire = "osm"
        except QBrokerError as exc:  # the same error element as on the qbroker endpoint
            result = error_result(command, exc.to_info(part=OSM_PART))
        except Exception as exc:
            log.exception("osm command crashed", command=command)
            crash = HandlerCrashed(f"unhandled {type(exc).__name__}")
            result = error_result(command, crash.to_info(part=OSM_PART))
        else:
            if command in UNANSWERED_IN_SEED and not message.correlation_id:
                return  # done; an osm render thread expects nothing back
        await self._reply(message, result)

    def _known_params(self, command: str, body: dict[str, Any], message: AbstractIncomingMessage) -> dict[str, Any]:
        known, ignored = known_params(COMMANDS[command].request, body)
        if ignored:
            self.qm.stats.count("osm_unknown_fields", len(ignored))
            log.info(
                "osm command: unknown fields ignored",
                command=command,
                fields=[f[:64] for f in ignored[:10]],
                routing_key=message.routing_key,
            )
        return known

    def _keep(self, command: str, request: Any, message: AbstractIncomingMessage) -> int | None:
        if self.waiters is None or not message.reply_to:
            return None
        return self.waiters.add(
            command,
            request.model_dump_json(),
            message.reply_to,
            message.correlation_id or message.message_id or "",
            message.user_id,
            None,
            wire="osm",
        )

    async def _reply(self, message: AbstractIncomingMessage, result: Any) -> None:
        if message.reply_to:
            await self.reply_to(message.reply_to, message.correlation_id or message.message_id, result)

    async def reply_to(self, reply_to: str, correlation_id: str | None, result: Any) -> None:
        """A raw JSON answer on the default exchange, as the protocol's clients expect (also after a restart)."""
        if self._channel is None:
            return
        try:
            await self._channel.default_exchange.publish(
                aio_pika.Message(orjson.dumps(result), content_type="application/json", correlation_id=correlation_id),
                routing_key=reply_to,
            )
        except Exception as exc:  # the requester's queue or our channel is gone: nothing to answer
            log.warning("osm reply not delivered", error=str(exc), reply_to=reply_to)
