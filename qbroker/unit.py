"""A unit: one process's presence on the bus (app name + uuid), with its endpoints and listeners."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, Unpack

from aio_pika.abc import AbstractIncomingMessage

from qbroker import rpc
from qbroker.alerts import Listener, serve_alert
from qbroker.bus import Bus
from qbroker.config import Config
from qbroker.dead_letter import DeadLetterCollector
from qbroker.discovery import START, STOP, Announcer
from qbroker.endpoints import CommandEndpoint, Endpoint, EndpointOptions, EndpointSettings
from qbroker.errors import NotStarted
from qbroker.exchanges import declare_unit_queue
from qbroker.handler_work import HandlerWork
from qbroker.handlers import Extra, Handler
from qbroker.log import dropped_log_lines, get_logger
from qbroker.middleware import Middleware
from qbroker.presence import ANNOUNCEMENTS, PING, Presence
from qbroker.replies import PendingReplies
from qbroker.schedule import Scheduler
from qbroker.serving import EndpointServing, broadcast_key, broadcast_listener
from qbroker.transport import Connection, Queue
from qbroker.unit_calls import State, UnitCalls

F = TypeVar("F", bound=Callable[..., Any])
OnConnected = Callable[[Connection], Awaitable[None]]


class Unit(UnitCalls):
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
        self.handler_work = HandlerWork(self.log)  # the handlers running now, for draining on stop()
        self._started_at = 0.0
        self.scheduler = Scheduler(self.log)
        self.serving = EndpointServing(self.bus, self.handler_work.track)
        # Bounded: a handler stuck in a thread holds one slot; once all are held, further sync requests
        # wait (and their endpoint timeout still answers the caller), the loop never does.
        self.sync_pool = ThreadPoolExecutor(
            max_workers=config.sync_handler_threads, thread_name_prefix=f"qbroker-{self.app}"
        )
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

    async def add_rpc(
        self, name: str, handler: Callable[..., Any], *, extra: Extra = "forbid", **options: Unpack[EndpointSettings]
    ) -> None:
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
        await self.handler_work.drain(timeout)  # on a timeout, the handlers still running are cancelled
        await self.bus.flush(timeout)  # the last replies and acks, queued, reach the broker before the close
        await self.announcer.announce(STOP)
        await self._close()

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
        await asyncio.gather(
            self.presence.attach(bus, connection, alert_queue.name, self._on_addressed),
            self.serving.attach(connection, list(self.endpoints.values())),
        )
        if self.dead_letters is not None:
            await self.dead_letters.attach(connection)
        for hook in self._hooks:
            await hook(connection)

    # -- consuming ---------------------------------------------------------------------------------

    async def _on_alert_message(self, message: AbstractIncomingMessage) -> None:
        if message.routing_key in ANNOUNCEMENTS and self.presence.heard(message, self.listeners):
            await message.ack()  # no listener of ours asked for it
            return
        await self.handler_work.track(serve_alert(self.bus, self.listeners, message))

    async def _on_addressed(self, address: Endpoint, message: AbstractIncomingMessage) -> None:
        await self.handler_work.track(rpc.serve_request(self.bus, address, message))

    # -- discovery ---------------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        return {
            "app": self.app,
            "uuid": self.uuid,
            "host": self.host,
            "pid": os.getpid(),
            "uptime": round(time.time() - self._started_at, 3) if self._started_at else 0.0,
            "listeners": sorted({listener.pattern for listener in self.listeners}),
            "endpoints": {name: ep.describe() for name, ep in sorted(self.endpoints.items())},
            "idle": self.serving.paused,
            **({"dead_letters": self.dead_letters.stats()} if self.dead_letters is not None else {}),
            **({"pings_refused": refused} if (refused := self.presence.guard.refused) else {}),
            # Log lines this process dropped because their stream failed (qbroker.log): a dead log pipe.
            **({"log_lines_dropped": dropped} if (dropped := dropped_log_lines()) else {}),
        }
