"""A renderer process: N render threads on one qbroker Unit, each rendering in a worker process.

Thread ``i`` is the exclusive command endpoint ``toposm.render.<host>.<pid>.<i>`` (its queue vanishes with
the process, so a call to a dead renderer fails at once with NoServer: that is how the queuemaster notices a
SIGKILL). Commands: ``render`` (answered ``accepted`` at once; the result goes to the queuemaster as
``rendered`` later) and ``ping`` (state and current metatile). The process listens for control alerts on
every level of the hierarchy: ``toposm``, ``toposm.render``, ``toposm.render.<host>``,
``toposm.render.<host>.<pid>`` and each thread's own name.

Asked to stop (SIGTERM, or a ``shutdown`` alert, which the process turns into SIGTERM so that both take the
runner's one path), it refuses new renders, finishes the metatiles in hand if they finish within
``drain_timeout``, then unregisters: the queuemaster puts whatever is still unfinished back in front.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import structlog

from qbroker import InvalidParams, NoServer, QBrokerError, RequestContext, RequestFailed, Unit
from services.toposm.contract import ALL_PROGRAMS, QUEUEMASTER, Command, render_levels, render_thread
from services.toposm.error_messages import failed
from services.toposm.messages import RegisterRequest, RenderCommand, RenderedRequest, UnregisterRequest
from services.toposm.metrics_port import service_metrics
from services.toposm.strategy import parse_strategy

from .metrics import NAMESPACE, RendererMetrics
from .osm_side import OsmSide
from .settings import RendererSettings
from .thread_state import RenderThread
from .worker import render_metatile, warm_up

log = structlog.get_logger("toposm.renderer")
APP = "toposm.renderer"


def _terminate_self() -> None:
    signal.raise_signal(signal.SIGTERM)


class RendererProcess:
    """The bus side of a renderer; ``request_stop`` is what a ``shutdown`` alert does (default: SIGTERM
    to this process, which the runner turns into ``stop()``)."""

    def __init__(
        self, unit: Unit, settings: RendererSettings, request_stop: Callable[[], None] = _terminate_self
    ) -> None:
        parse_strategy(settings.strategy)  # fail fast on a bad --strategy
        if settings.threads < 1:
            raise ValueError("threads must be at least 1")
        self.settings = settings
        self.pid = os.getpid()
        self.unit = unit
        self.request_stop = request_stop
        self.started = False
        self.threads = [RenderThread(i, render_thread(settings.hostname, self.pid, i)) for i in range(settings.threads)]
        self.stopping = asyncio.Event()
        self.ask_next = True  # take the next metatile with the answer to `rendered` (off for old queuemasters)
        self.watchdog_rounds = 0  # how often the watchdog looked (tests wait on it, not on the clock)
        self._pool = self._new_pool()
        self._background: set[asyncio.Task[Any]] = set()
        self._idle = asyncio.Condition()  # notified whenever a thread becomes idle
        self.metrics_server = service_metrics(NAMESPACE, settings.metrics_port, settings.metrics_host)
        self.metrics = RendererMetrics(self.metrics_server.registry, settings.threads)
        self.metrics_server.refreshers.append(lambda: self.metrics.busy.set(sum(1 for t in self.threads if t.metatile)))
        self.metrics_server.instrument(unit)
        for thread in self.threads:
            self._serve_thread(thread)
        root, host, process = render_levels(settings.hostname, self.pid)
        self._serve_level(root, exclusive=False)
        self._serve_level(host, exclusive=False)
        self._serve_level(process, exclusive=True)  # only this process: gone with it
        for level in (ALL_PROGRAMS, root, host, process):
            self.unit.on_alert(level)(self._on_control)
        for thread in self.threads:
            self.unit.on_alert(thread.endpoint)(self._on_control)
        # The `osm` wire too: listening on toposm and every level, its own queue as reply_to (osm_side).
        keys = [ALL_PROGRAMS, *render_levels(settings.hostname, self.pid), *(t.endpoint for t in self.threads)]
        self.osm = OsmSide(keys, lambda: unit.bus.supervisor.user, self._render_from_osm, self._register_all_on_osm)
        unit.on_connected(self.osm.declare)

    def _new_pool(self) -> ProcessPoolExecutor:
        # spawn, not fork: the parent holds an event loop and an AMQP connection that must not be copied.
        return ProcessPoolExecutor(max_workers=self.settings.threads, mp_context=multiprocessing.get_context("spawn"))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- endpoints ------------------------------------------------------------------------------------

    def _serve_thread(self, thread: RenderThread) -> None:
        endpoint = self.unit.commands(thread.endpoint, exclusive=True, prefetch=8)

        @endpoint.command(Command.RENDER)
        async def render(command: RenderCommand, ctx: RequestContext) -> dict[str, Any]:
            self._check_sender(ctx)
            thread.heard_over_qbroker()
            if thread.metatile is not None:
                raise failed("busy", f"{thread.endpoint} is rendering {thread.metatile}")
            return self._accept(thread, command.metatile)

        @endpoint.command(Command.PING)
        async def ping() -> dict[str, Any]:
            thread.heard_over_qbroker()
            return {"command": Command.PONG, **thread.describe()}

    def _serve_level(self, level: str, *, exclusive: bool) -> None:
        """``render``/``ping`` sent to a level above the threads (``toposm.render``, ``.<host>``,
        ``.<host>.<pid>``) reach one idle thread below it: every process under the level consumes one
        shared queue with prefetch 1, so the broker hands each request to one process at a time, and
        the process gives it to a thread of its own as soon as one is idle."""
        endpoint = self.unit.commands(level, exclusive=exclusive, prefetch=1)

        @endpoint.command(Command.RENDER)
        async def render(command: RenderCommand, ctx: RequestContext) -> dict[str, Any]:
            self._check_sender(ctx)
            thread = await self._idle_thread(ctx)
            thread.last_contact = time.monotonic()
            return self._accept(thread, command.metatile)

        @endpoint.command(Command.PING)
        async def ping(ctx: RequestContext) -> dict[str, Any]:
            thread = await self._idle_thread(ctx)
            return {"command": Command.PONG, **thread.describe()}

    def _check_sender(self, ctx: RequestContext) -> None:
        allowed = self.settings.queuemaster_users
        if allowed is not None and ctx.user_id not in allowed:
            raise failed("forbidden", "only the queuemaster sends render")

    def _render_from_osm(self, key: str, metatile: str, user: str | None) -> bool:
        """A `render` heard on osm at ``key`` (a thread's name or a level): taken by an idle thread there."""
        allowed = self.settings.queuemaster_users
        if self.stopping.is_set() or (allowed is not None and user not in allowed):
            return False
        named = [t for t in self.threads if t.endpoint == key]
        idle = [t for t in named or self.threads if t.metatile is None and not t.reporting]
        if not idle:
            return False
        self._accept(idle[0], metatile, wire="osm")
        return True

    def _accept(self, thread: RenderThread, metatile: str, wire: str = "qbroker") -> dict[str, Any]:
        if self.stopping.is_set():
            raise failed("stopping", thread.endpoint)
        thread.reporting = False
        thread.wire = wire
        thread.metatile = metatile
        thread.task = asyncio.create_task(self._render(thread, metatile))
        return {"command": Command.ACCEPTED, "metatile": metatile, "renderer": thread.endpoint}

    async def _idle_thread(self, ctx: RequestContext) -> RenderThread:
        """An idle thread of this process, waiting for one (at most until the request's deadline)."""
        deadline = ctx.deadline
        wait = None if deadline is None else max(0.0, deadline - time.time())
        try:
            async with asyncio.timeout(wait), self._idle:
                await self._idle.wait_for(
                    lambda: self.stopping.is_set() or any(t.metatile is None and not t.reporting for t in self.threads)
                )
        except TimeoutError:
            raise failed(
                "busy", f"no render thread of {self.unit.app} pid {self.pid} became idle before the request's deadline"
            ) from None
        if self.stopping.is_set():
            raise failed("stopping", f"renderer pid {self.pid}")
        return next(t for t in self.threads if t.metatile is None and not t.reporting)

    async def _on_control(self, body: Any, ctx: RequestContext) -> dict[str, Any] | None:
        """Control alerts: ``queuemaster online`` (register again), ``status``, ``shutdown``."""
        command = body.get("command") if isinstance(body, dict) else None
        if command == Command.QUEUEMASTER_ONLINE:
            if self.started:  # before that, start() registers once the backends are loaded
                self._spawn(self.register_all())
            return None
        if command == Command.STATUS:
            threads = [s for s in self.threads if s.endpoint == ctx.name] or self.threads
            return {
                "command": Command.STATUS,
                "pid": self.pid,
                "hostname": self.settings.hostname,
                "backend": self.settings.backend,
                "strategy": self.settings.strategy,
                "threads": [s.describe() for s in threads],
            }
        if command == Command.SHUTDOWN:
            # Not in the TopOSM protocol, and it stops real work: only an operator account may ask (user_id is
            # validated by RabbitMQ); everyone else gets `forbidden` and the renderer keeps running.
            if ctx.user_id not in self.settings.operator_users:
                raise failed("forbidden", "shutdown is for operator accounts")
            if not self.stopping.is_set():
                self.stopping.set()  # refuse renders from now on
                asyncio.get_running_loop().call_soon(self.request_stop)
            return {"command": Command.SHUTTING_DOWN, "pid": self.pid}
        if command is not None:
            log.debug("control alert ignored", command=command, name=ctx.name)
        return None

    # -- rendering ------------------------------------------------------------------------------------

    async def _render(self, thread: RenderThread, metatile: str) -> None:
        started = time.time()
        loop = asyncio.get_running_loop()
        s = self.settings
        try:
            duration = await loop.run_in_executor(
                self._pool, render_metatile, s.backend, str(s.tile_root), metatile, s.render_delay, s.tile_store
            )
            report: dict[str, Any] = {"status": "ok", "duration": round(duration, 4)}
        except BrokenProcessPool:
            self._pool = self._new_pool()  # a worker died (OOM, segfault in a backend): start afresh
            report = {
                "status": "error",
                "reason": "render worker process died",
                "duration": round(time.time() - started, 4),
            }
        except Exception as exc:  # the backend or the tile store failed: report it, keep serving
            report = {
                "status": "error",
                "reason": f"{type(exc).__name__}: {exc}",
                "duration": round(time.time() - started, 4),
            }
        self.metrics.rendered(metatile, report)
        # Idle before reporting (for the queuemaster's own `render` to this thread: it may dispatch the next
        # metatile before our call returns), and asking for the next metatile in the answer instead.
        thread.metatile, thread.task = None, None
        body = RenderedRequest(
            metatile=metatile,
            start=round(started, 4),
            hostname=s.hostname,
            pid=self.pid,
            threadid=thread.threadid,
            **report,
        ).body()
        if thread.wire == "osm":  # reported where the work came from, with our osm queue as reply_to
            await self._report_on_osm(thread, body)
            return
        ask_next = self.ask_next and not self.stopping.is_set()
        thread.reporting = ask_next
        if not ask_next:
            async with self._idle:
                self._idle.notify_all()
        answer = await self._report(thread, {**body, "next": ask_next})
        if not thread.reporting:  # a `render` came meanwhile (the answer had none): that one runs
            return
        thread.reporting = False
        handed = answer.get("render") if isinstance(answer, dict) else None
        if isinstance(handed, str) and not self.stopping.is_set():
            thread.heard_over_qbroker()
            self._accept(thread, handed)
            return
        async with self._idle:
            self._idle.notify_all()

    async def _report_on_osm(self, thread: RenderThread, body: dict[str, Any]) -> None:
        try:
            await self.osm.send(body)
        except Exception as exc:  # the `osm` wire has no retry of its own; the queuemaster's liveness does
            log.error("could not report render on osm", error=repr(exc), metatile=body["metatile"])
        async with self._idle:
            self._idle.notify_all()

    async def _register_all_on_osm(self) -> None:
        """A queuemaster announced itself on osm only: register every thread there (reply_to: our queue)."""
        for thread in self.threads:
            await self.osm.send(self._register_body(thread))
            thread.registered_on = "osm"

    async def _report(self, thread: RenderThread, body: dict[str, Any]) -> Any:
        """Deliver ``rendered`` (retried while the queuemaster is away); its answer, or None."""
        deadline = time.monotonic() + self.settings.report_retry_for
        if not self.ask_next:
            body.pop("next", None)
        while True:
            try:
                return await self.unit.call(QUEUEMASTER, body, timeout=5)
            except RequestFailed as exc:
                if isinstance(exc, InvalidParams) and body.pop("next", None) is not None:
                    # A queuemaster from before `next` refuses the field: report the old way from now on.
                    log.warning("queuemaster does not hand out work with rendered; not asking again")
                    self.ask_next = False
                    continue
                if not isinstance(exc, NoServer):
                    log.error("queuemaster refused rendered", error=str(exc), metatile=body["metatile"])
                    return None
                failure: Exception = exc
            except QBrokerError as exc:  # timeout, connection lost: the queuemaster may be restarting
                failure = exc
            if time.monotonic() > deadline or self.stopping.is_set():
                log.error("could not report render", error=str(failure), metatile=body["metatile"])
                return None
            await asyncio.sleep(1.0)

    # -- registration and lifecycle ---------------------------------------------------------------------

    def _register_body(self, thread: RenderThread) -> dict[str, Any]:
        request = RegisterRequest(
            hostname=self.settings.hostname, pid=self.pid, threadid=thread.threadid, strategy=self.settings.strategy
        )
        if thread.metatile is not None:
            request.metatile = thread.metatile
        return request.body()

    async def register(self, thread: RenderThread) -> bool:
        try:
            await self.unit.call(QUEUEMASTER, self._register_body(thread), timeout=5)
        except QBrokerError as exc:
            log.info("registration pending: queuemaster not reachable", renderer=thread.endpoint, error=str(exc))
            return False
        thread.heard_over_qbroker()
        return True

    async def register_all(self) -> None:
        await asyncio.gather(*(self.register(thread) for thread in self.threads))

    async def _watchdog(self) -> None:
        """Register again when the queuemaster has not pinged a thread for a while (it dropped us); not a
        thread registered on `osm` (see ``RenderThread.registered_on``): that would move it off that wire."""
        while not self.stopping.is_set():
            await asyncio.sleep(self.settings.reregister_after / 2)
            self.watchdog_rounds += 1
            for thread in self.threads:
                if (
                    thread.registered_on == "qbroker"
                    and time.monotonic() - thread.last_contact > self.settings.reregister_after
                ):
                    await self.register(thread)

    async def start(self) -> None:
        """Load the backends, then offer every render thread to the queuemaster."""
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(self._pool, warm_up, self.settings.backend) for _ in self.threads))
        self.started = True
        self.metrics_server.start()
        await self.register_all()
        self._spawn(self._watchdog())
        log.info(
            "renderer running",
            threads=len(self.threads),
            backend=self.settings.backend,
            strategy=self.settings.strategy,
        )

    async def stop(self) -> None:
        """Finish the renders in hand (and report them) within the drain timeout, then unregister."""
        self.stopping.set()
        async with self._idle:  # requests waiting for an idle thread are answered `stopping`
            self._idle.notify_all()
        in_hand = [t.task for t in self.threads if t.task]
        if in_hand:
            log.info("finishing renders before stopping", metatiles=[t.metatile for t in self.threads if t.metatile])
            await asyncio.wait(in_hand, timeout=self.settings.drain_timeout)
        try:
            # Hands back to the queuemaster whatever is still unfinished.
            await self.unit.call(QUEUEMASTER, UnregisterRequest().body(), timeout=3)
        except QBrokerError as exc:
            log.info("unregister not delivered", error=str(exc))
        if any(t.registered_on == "osm" for t in self.threads):
            await self.osm.unregister()
        for task in [*self._background, *(t.task for t in self.threads if t.task)]:
            task.cancel()
        await self.metrics_server.stop()
        # Don't let the interpreter's exit wait for an abandoned render (ProcessPoolExecutor joins its
        # workers at exit). The executor has no public kill, hence the private process table.
        workers = list(getattr(self._pool, "_processes", {}).values())
        self._pool.shutdown(wait=False, cancel_futures=True)
        for worker in workers:
            worker.terminate()
