"""A unit: one process's presence on the bus (app name + uuid), with its endpoints and listeners."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, TypeVar, Unpack

from aio_pika.abc import AbstractIncomingMessage

from qbroker import rpc
from qbroker.alerts import Listener, gather, serve_alert
from qbroker.bus import Bus
from qbroker.config import Config
from qbroker.dead_letter import DeadLetterCollector
from qbroker.discovery import START, STOP, Announcer
from qbroker.endpoints import CommandEndpoint, Endpoint, EndpointOptions, EndpointSettings
from qbroker.envelope import JSON, new_message_id
from qbroker.errors import ConnectionLost, ErrorInfo, NotStarted
from qbroker.exchanges import declare_unit_queue
from qbroker.handlers import Extra, Handler
from qbroker.log import dropped_log_lines, get_logger
from qbroker.middleware import Middleware
from qbroker.presence import ANNOUNCEMENTS, PING, Presence
from qbroker.replies import PendingReplies, Reply
from qbroker.schedule import Schedule, Scheduler
from qbroker.serving import EndpointServing, broadcast_key, broadcast_listener
from qbroker.transport import Connection, Queue

F = TypeVar("F", bound=Callable[..., Any])
OnConnected = Callable[[Connection], Awaitable[None]]
State = Literal["new", "starting", "started", "stopping", "stopped"]


class Unit:
    """Connect, declare, serve endpoints and listeners, call and alert. See docs/library.md."""

    def __init__(self, app: str | None = None, *, config: Config | None = None, **overrides: Any) -> None:
        config = config or Config()
        if overrides:
            config = config.model_copy(update=overrides)
        self.config = config
        self.app = app or config.app
        self.uuid = uuid.uuid4().hex
        self.host = socket.gethostname()
        self.log = get_logger(app=self.app, uuid=self.uuid)
        self.bus = Bus(config, app=self.app, uuid=self.uuid, log=self.log, on_connected=self._on_connected)
        self.endpoints: dict[str, Endpoint] = {}
        self._alert_queue: Queue | None = None
        self.listeners: list[Listener] = []
        # (part, kind, status, seconds) after each handler: the chain's HandlerObservers link
        self.handler_observers = self.bus.middleware.observers
        self.state: State = "new"
        self._hooks: list[OnConnected] = []
        self._inflight = 0
        self._handlers: set[asyncio.Task[Any]] = set()  # the tasks running ``_track``ed work, for stop()
        self._idle = asyncio.Event()
        self._idle.set()
        self._started_at = 0.0
        self.scheduler = Scheduler(self.log)
        self.serving = EndpointServing(self.bus, self._track)
        # Bounded: a handler stuck in a thread holds one slot; once all are held, further sync requests
        # wait (and their endpoint timeout still answers the caller), the loop never does.
        self.sync_pool = ThreadPoolExecutor(max_workers=config.sync_handler_threads,
                                            thread_name_prefix=f"qbroker-{self.app}")
        self.announcer = Announcer(self.bus, self.describe)
        # Its ping answers (under a guard), and its addresses for the original QBroker's discovery.
        self.presence = Presence(self.app, self.uuid, self.describe, self.endpoints, config)
        self.on_alert(PING)(self.presence.answer)
        self.dead_letters = DeadLetterCollector(self.bus) if config.dead_letters else None
        if config.otel:
            from qbroker.tracing import Tracing  # an optional dependency: imported only when asked for

            self.use(Tracing())

    # -- registration ---------------------------------------------------------------------------

    def _check_new(self, what: str) -> None:
        if self.state != "new":
            raise NotStarted(f"register {what} before start()")

    def rpc(self, name: str, *, extra: Extra = "forbid", **options: Unpack[EndpointSettings]) -> Callable[[F], F]:
        """Serve RPC requests named ``name`` with the decorated handler; ``options`` are ``EndpointOptions``
        (prefetch, priority, timeout, retries, max_body_bytes...), ``extra`` what to do with unknown fields.

        ``priority`` is this server's consumer priority among the servers of ``name``: higher ones get
        work first, lower ones (standbys, light machines) only when the higher ones are at ``prefetch``.
        ``max_body_bytes`` caps this endpoint's request bodies below the unit's limit."""
        self._check_new(f"endpoint {name!r}")
        endpoint = self._add_endpoint(Endpoint, name, EndpointOptions(**options))

        def register(fn: F) -> F:
            endpoint.handler = Handler(fn, name, extra=extra, executor=self.sync_pool)
            return fn

        return register

    def commands(self, name: str, **options: Unpack[EndpointSettings]) -> CommandEndpoint:
        """A TopOSM-style endpoint dispatching on the body's ``command``; add commands with ``.command()``.
        ``options`` as ``rpc()``."""
        self._check_new(f"endpoint {name!r}")
        endpoint = self._add_endpoint(CommandEndpoint, name, EndpointOptions(**options))
        assert isinstance(endpoint, CommandEndpoint)
        return endpoint

    def _add_endpoint(self, cls: type[Endpoint], name: str, options: EndpointOptions) -> Endpoint:
        if name in self.endpoints:
            raise ValueError(f"endpoint {name!r} is already registered")
        endpoint = cls(name=name, options=options, executor=self.sync_pool)
        self.endpoints[name] = endpoint
        self.listeners.append(broadcast_listener(endpoint))  # every server of a name hears its broadcasts
        return endpoint

    def on_alert(self, pattern: str, *, extra: Extra = "ignore") -> Callable[[F], F]:
        """Listen to alerts whose name matches the topic ``pattern`` (``#`` and ``*`` wildcards)."""
        self._check_new(f"listener {pattern!r}")

        def register(fn: F) -> F:
            self.listeners.append(Listener(pattern, Handler(fn, pattern, extra=extra, executor=self.sync_pool)))
            return fn

        return register

    async def add_rpc(self, name: str, handler: Callable[..., Any], *, extra: Extra = "forbid",
                      **options: Unpack[EndpointSettings]) -> None:
        """Serve ``name`` from now on, on a running unit (RQ consume at run time); options as ``rpc()``."""
        self._check_started("add_rpc")
        endpoint = self._add_endpoint(Endpoint, name, EndpointOptions(**options))
        endpoint.handler = Handler(handler, name, extra=extra, executor=self.sync_pool)
        connection = self.connection
        if connection is not None and not connection.is_closed:  # else the next (re)connect consumes it
            await self.serving.add(connection, endpoint)
            if self._alert_queue is not None:
                await self._alert_queue.bind(self.config.exchange_name("alert"), routing_key=broadcast_key(name))
        await self.announcer.announce(START)  # debuggers and directories follow the new name

    async def remove_endpoint(self, name: str) -> None:
        """Stop serving ``name`` (RQ cancel queue): requests in hand finish, new ones go to other servers,
        or, once none is left for the grace period, are answered ``no_server``."""
        self._check_started("remove_endpoint")
        if self.endpoints.pop(name, None) is None:
            raise ValueError(f"no endpoint {name!r} on this unit")
        await self.serving.remove(name)
        self.listeners = [listener for listener in self.listeners if listener.pattern != broadcast_key(name)]
        if self._alert_queue is not None:
            with contextlib.suppress(Exception):  # a lost connection drops the binding with the queue
                await self._alert_queue.unbind(self.config.exchange_name("alert"), routing_key=broadcast_key(name))
        await self.announcer.announce(START)

    async def pause(self) -> None:
        """Idle (RQ IDLE): take no new requests (they go to the other servers); the ones in hand finish."""
        self._check_started("pause")
        await self.serving.pause()

    async def resume(self) -> None:
        """Take requests again after ``pause()``."""
        self._check_started("resume")
        await self.serving.resume()

    def use(self, middleware: Middleware, *, inner: bool = False) -> Middleware:
        """Add ``middleware`` to every request and alert this unit handles and every message it sends.

        Outer ones (the default) run before the built-ins (poison count, deadline, delivered notice,
        retries) in the order added; ``inner`` ones just around the handler. See qbroker.middleware."""
        self.bus.middleware.use(middleware, inner=inner)
        return middleware

    def on_connected(self, hook: OnConnected) -> OnConnected:
        """Run ``hook(connection)`` after every (re)connect, once the qbroker topology is declared."""
        self._hooks.append(hook)
        return hook

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        if self.state != "new":
            raise NotStarted(f"start() on a unit that is {self.state}")
        for endpoint in self.endpoints.values():
            if endpoint.handler is None and not isinstance(endpoint, CommandEndpoint):
                raise ValueError(f"endpoint {endpoint.name!r} has no handler")
        self._started_at = time.time()
        # Consumers attach inside bus.start(): a request or alert already waiting is handled before start()
        # returns, and its handler may call, cast or alert ("starting" lets it).
        self.state = "starting"
        try:
            await self.bus.start()
        except BaseException:
            self.state = "new"
            raise
        self.state = "started"
        self.log.info("unit started", endpoints=sorted(self.endpoints))
        await self.announcer.announce_start()

    async def stop(self, drain_timeout: float | None = None) -> None:
        """Stop taking work, let running handlers finish (up to the drain timeout), then close."""
        if self.state != "started":
            return
        self.state = "stopping"
        await self.scheduler.close()
        await self.bus.stop_consuming()
        timeout = self.config.drain_timeout if drain_timeout is None else drain_timeout
        try:
            async with asyncio.timeout(timeout):  # not wait_for: 3.11's can swallow a cancel
                await self._idle.wait()
        except TimeoutError:
            self.log.warning("drain timed out; abandoning the handlers still running", running=self._inflight)
            await self._abandon_handlers(timeout)
        await self.bus.flush(timeout)  # the last replies and acks, queued, reach the broker before the close
        await self.announcer.announce(STOP)
        await self._close()

    async def _abandon_handlers(self, drain_timeout: float) -> None:
        """Cancel every handler still running, at once: left running, they would compete with the close for
        the loop (docs/performance.md, "Parked render requests"). A cancelled handler sends no reply (a
        request not acked is delivered again, as after ``kill()``); one ignoring the cancel is not waited for."""
        tasks = [task for task in self._handlers if not task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=min(1.0, max(0.05, drain_timeout)))
        self.log.info("handlers abandoned", count=len(tasks), still_running=self._inflight)

    async def kill(self) -> None:
        """Close at once: running handlers are abandoned and their requests redelivered elsewhere."""
        if self.state in ("started", "stopping"):
            await self._close()

    async def _close(self) -> None:
        await self.scheduler.close()
        self.serving.close()
        # Threads cannot be stopped: abandon the ones still running (their requests were answered by
        # their timeout, or are redelivered) and drop the queued ones.
        self.sync_pool.shutdown(wait=False, cancel_futures=True)
        await self.bus.close(f"unit {self.app} stopped")
        self.state = "stopped"
        self.log.info("unit stopped")

    async def __aenter__(self) -> Unit:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def connection(self) -> Connection | None:
        return self.bus.connection

    @property
    def pending(self) -> PendingReplies:
        """Calls and gathers waiting for replies."""
        return self.bus.pending

    async def wait_connected(self, timeout: float | None) -> bool:
        return await self.bus.wait_connected(timeout)

    # -- (re)connecting ---------------------------------------------------------------------------

    async def _on_connected(self, connection: Connection) -> None:
        """Called by the bus once its exchanges and reply queue are up: our listeners and endpoints."""
        bus = self.bus
        alert_channel = await bus.channel(connection, confirms=False)
        await alert_channel.set_qos(prefetch_count=256)
        alert_queue = self._alert_queue = await declare_unit_queue(alert_channel, self.config, "alert", self.uuid)
        alert_exchange = self.config.exchange_name("alert")
        for pattern in sorted({listener.pattern for listener in self.listeners}):
            await alert_queue.bind(alert_exchange, routing_key=pattern)
        await bus.add_consumer(alert_queue, self._on_alert_message, part="qbroker.alert")
        # At once: the presence's channels fail alone (qbroker.presence), the endpoints' reconnect the unit.
        await asyncio.gather(self.presence.attach(bus, connection, alert_queue.name, self._on_addressed),
                             self.serving.attach(connection, list(self.endpoints.values())))
        if self.dead_letters is not None:
            await self.dead_letters.attach(connection)
        for hook in self._hooks:
            await hook(connection)

    # -- consuming ---------------------------------------------------------------------------------

    async def _on_alert_message(self, message: AbstractIncomingMessage) -> None:
        if message.routing_key in ANNOUNCEMENTS and self.presence.heard(message, self.listeners):
            await message.ack()  # no listener of ours asked for it
            return
        await self._track(serve_alert(self.bus, self.listeners, message))

    async def _on_addressed(self, address: Endpoint, message: AbstractIncomingMessage) -> None:
        await self._track(rpc.serve_request(self.bus, address, message))

    async def _track(self, work: Awaitable[None]) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        self._inflight += 1
        self._idle.clear()
        try:
            await work  # what it raises, the bus's consumer guard answers and acks (Bus.settle_failed)
        finally:
            self._inflight -= 1
            if task is not None:
                self._handlers.discard(task)
                del task  # the frame, kept by a cancelled task's exception, must not keep the task: a cycle
            if self._inflight == 0:
                self._idle.set()

    # -- calling and alerting ------------------------------------------------------------------------

    def _check_started(self, what: str) -> None:
        if self.state not in ("starting", "started"):
            raise NotStarted(f"{what}() on a unit that is {self.state}: call start() first")

    async def call_reply(self, name: str, body: Any = None, *, timeout: float | None = None, debug: bool = False,
                         priority: int | None = None, retries: int = 0, content_type: str = JSON,
                         guarantee: bool = False, on_delivered: Callable[[Reply], object] | None = None) -> Reply:
        """Call ``name``; return the Reply (ok or warn), raise the remote error (error or fail).

        ``guarantee``: a persistent request that survives a broker restart; ``on_delivered(notice)``: called
        when a server picks the request up (RQ DELIVERED). See docs/semantics.md."""
        self._check_started("call")
        timeout = self.config.call_timeout if timeout is None else timeout
        return await rpc.call_with_retries(self.bus, name, body, timeout=timeout, debug=debug, priority=priority,
                                           retries=retries, content_type=content_type, guarantee=guarantee,
                                           on_delivered=on_delivered, running=self._running)

    def _running(self) -> bool:
        return self.state in ("starting", "started")

    async def call(self, name: str, body: Any = None, *, timeout: float | None = None, debug: bool = False,
                   priority: int | None = None, retries: int = 0, content_type: str = JSON,
                   guarantee: bool = False, on_delivered: Callable[[Reply], object] | None = None) -> Any:
        """Call ``name`` and return the reply body; raise the remote error."""
        reply = await self.call_reply(name, body, timeout=timeout, debug=debug, priority=priority,
                                      retries=retries, content_type=content_type, guarantee=guarantee,
                                      on_delivered=on_delivered)
        return reply.body

    async def cast(self, name: str, body: Any = None, *, priority: int | None = None,
                   ttl: float | None = None, content_type: str = JSON, guarantee: bool = False) -> None:
        """A one-way request (RQ NOREPLY): one server handles it, nobody is answered; ``guarantee``: persistent."""
        self._check_started("cast")
        # Unserved casts expire (to `dead`, counted) instead of running as a stale burst on restart.
        ttl = self.config.cast_ttl if ttl is None else ttl
        with self.bus.middleware.sending("cast", name) as sending:
            message = self.bus.make_message(body, kind="rpc", name=name, message_id=new_message_id(),
                                            content_type=content_type, expiration_s=ttl, priority=priority,
                                            deadline=time.time() + ttl, persistent=guarantee,
                                            extra_headers=sending.headers)
            if not await self.bus.wait_connected(self.config.call_timeout):
                raise ConnectionLost(f"not connected to a broker (cast {name})")
            if guarantee:  # confirmed, published again across a lost connection for up to call_timeout
                loop = asyncio.get_running_loop()
                await rpc.publish_until_confirmed(self.bus, name, message, until=loop.time() + self.config.call_timeout,
                                                  expires_at=loop.time() + ttl)
            else:
                await self.bus.publish("rpc", name, message)

    def schedule(self, name: str, body: Any = None, *, every: float | None = None, cron: str | None = None,
                 kind: Literal["cast", "alert"] = "cast", nohaste: bool = False) -> Schedule:
        """Send ``name`` every ``every`` seconds or on a ``cron`` line until unscheduled or stopped."""
        self._check_started("schedule")

        made: list[Schedule] = []

        async def send() -> None:
            if kind == "alert":
                await self.alert(name, body)
            else:
                # A send is stale once the next one is due: that is its TTL (at most cast_ttl).
                due = made[0].next_delay(time.time(), first=False) if made else self.config.cast_ttl
                await self.cast(name, body, ttl=max(0.001, min(due, self.config.cast_ttl)))

        made.append(self.scheduler.add(name, kind, send, every=every, cron=cron, nohaste=nohaste))
        return made[0]

    def unschedule(self, schedule_id: str) -> bool:
        return self.scheduler.remove(schedule_id)

    async def alert(self, name: str, body: Any = None, *, content_type: str = JSON,
                    error: ErrorInfo | None = None, message_id: str | None = None) -> None:
        """Broadcast the alert ``name`` to every listener whose pattern matches (nobody answers).

        ``error`` attaches an error element: report an error state, or (status ``ok``) say it is over.
        ``message_id`` (default: a new random one) lets a sender give one event the same id wherever it
        publishes it, so listeners that hear it twice can tell."""
        self._check_started("alert")
        with self.bus.middleware.sending("alert", name) as sending:
            message = self.bus.make_message(body, kind="alert", name=name, message_id=message_id or new_message_id(),
                                            content_type=content_type, error=error, extra_headers=sending.headers)
            if not await self.bus.wait_connected(self.config.call_timeout):
                raise ConnectionLost(f"not connected to a broker (alert {name})")
            await self.bus.publish("alert", name, message)

    def gather(self, name: str, body: Any = None, *, timeout: float | None = None, max_replies: int | None = None,
               gap: float | None = None, content_type: str = JSON) -> AsyncIterator[Reply]:
        """Broadcast ``name`` and iterate over the replies (stops on count, deadline or gap)."""
        self._check_started("gather")
        return gather(self.bus, name, body, timeout=self.config.call_timeout if timeout is None else timeout,
                      max_replies=max_replies, gap=gap, content_type=content_type)

    def broadcast(self, name: str, body: Any = None, *, timeout: float | None = None,
                  max_replies: int | None = None, gap: float | None = None) -> AsyncIterator[Reply]:
        """Send a request to *every* server of ``name`` (RQ BROADCAST) and iterate over their replies,
        as ``gather`` does (errors come as replies with ``reply.error``, not raised)."""
        return self.gather(broadcast_key(name), body, timeout=timeout, max_replies=max_replies, gap=gap)

    # -- discovery ---------------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        return {
            "app": self.app, "uuid": self.uuid, "host": self.host, "pid": os.getpid(),
            "uptime": round(time.time() - self._started_at, 3) if self._started_at else 0.0,
            "listeners": sorted({listener.pattern for listener in self.listeners}),
            "endpoints": {name: ep.describe() for name, ep in sorted(self.endpoints.items())},
            "idle": self.serving.paused,
            **({"dead_letters": self.dead_letters.stats()} if self.dead_letters is not None else {}),
            **({"pings_refused": refused} if (refused := self.presence.guard.refused) else {}),
            # Log lines this process dropped because their stream failed (qbroker.log): a dead log pipe.
            **({"log_lines_dropped": dropped} if (dropped := dropped_log_lines()) else {}),
        }

