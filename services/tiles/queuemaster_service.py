"""The queuemaster on the bus: endpoint ``toposm.queuemaster``, expirations, dispatch and liveness.

* ``toposm.queuemaster`` is a qbroker command endpoint (register, rendered, unregister, render, expire,
  stats); the same handlers serve the seed's literal ``osm`` exchange wire (see ``osm_wire``).
* Expirations arrive as text ``z/x/y;...`` alerts on ``expire_toposm``.
* A dispatch loop sends ``render`` to idle render threads whenever work or a thread becomes available.
* A liveness loop pings every registered thread; NoServer (its exclusive queue vanished with its process)
  or ``ping_misses`` unanswered pings in a row mean it died: its metatile goes back to the front.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from pydantic import ValidationError

from qbroker import CallTimeout, Config, NoServer, QBrokerError, RequestContext, RequestFailed, Unit

from .messages import (
    ExpireRequest,
    Message,
    RegisterRequest,
    RenderedRequest,
    RenderTileRequest,
    UnregisterRequest,
)
from .osm_wire import OsmWire
from .queuemaster import Queuemaster, QueuemasterSettings
from .renderers import RenderThread
from .tilemath import Metatile

log = structlog.get_logger("toposm.queuemaster")
ENDPOINT = "toposm.queuemaster"
EXPIRE_TOPIC = "expire_toposm"
ONLINE = {"command": "queuemaster online"}


class QueuemasterService:
    def __init__(self, settings: QueuemasterSettings, config: Config | None = None) -> None:
        self.qm = Queuemaster(settings)
        self.settings = settings
        self.unit = Unit(ENDPOINT, config=config)  # None: Config() from QBROKER_* env
        self.osm = OsmWire(self)
        self._tasks: list[asyncio.Task[None]] = []
        self._calls: set[asyncio.Task[None]] = set()
        self._register_handlers()
        self.unit.on_connected(self.osm.declare)

    # -- the command handlers (shared by the qbroker endpoint and the raw osm wire) ---------------------

    async def handle(self, command: str, params: dict[str, Any], reply_to: str | None) -> Any:
        """Run one command with raw parameters; raises RequestFailed/RequestError like a handler."""
        models: dict[str, type[Message]] = {
            "register": RegisterRequest, "rendered": RenderedRequest, "unregister": UnregisterRequest,
            "render": RenderTileRequest, "expire": ExpireRequest,
        }
        if command == "stats":
            return self.qm.describe()
        model = models.get(command)
        if model is None:
            known = ", ".join(sorted([*models, "stats"]))
            raise RequestFailed("unknown_command", f"unknown command {command!r} (known: {known})")
        try:
            request = model.model_validate(params)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}"
                                 for e in exc.errors())
            raise RequestFailed("invalid_params", f"invalid parameters for {command}: {problems}") from None
        return await self._run(request, reply_to)

    async def _run(self, request: Any, reply_to: str | None) -> Any:
        qm = self.qm
        if isinstance(request, RegisterRequest):
            return qm.register(request, reply_to)
        if isinstance(request, RenderedRequest):
            return qm.rendered(request)
        if isinstance(request, UnregisterRequest):
            return qm.unregister(request, reply_to)
        if isinstance(request, ExpireRequest):
            return {"command": "expired", **qm.expire(request.text, strict=True)}
        assert isinstance(request, RenderTileRequest)
        return await qm.request(request.tile)

    def _register_handlers(self) -> None:
        endpoint = self.unit.commands(ENDPOINT, prefetch=256)

        @endpoint.command("register")
        async def register(req: RegisterRequest, ctx: RequestContext) -> Any:
            return await self._run(req, ctx.reply_to)

        @endpoint.command("rendered")
        async def rendered(req: RenderedRequest, ctx: RequestContext) -> Any:
            return await self._run(req, ctx.reply_to)

        @endpoint.command("unregister")
        async def unregister(req: UnregisterRequest, ctx: RequestContext) -> Any:
            return await self._run(req, ctx.reply_to)

        @endpoint.command("render")
        async def render(req: RenderTileRequest, ctx: RequestContext) -> Any:
            # A render may take minutes: do not hold a prefetch slot while waiting for it.
            await ctx.detach()
            return await self._run(req, ctx.reply_to)

        @endpoint.command("expire")
        async def expire(req: ExpireRequest, ctx: RequestContext) -> Any:
            return await self._run(req, ctx.reply_to)

        @endpoint.command("stats")
        async def stats() -> Any:
            return self.qm.describe()

        @self.unit.on_alert(EXPIRE_TOPIC)
        async def on_expire(body: Any) -> None:
            self.expire_text(body)

    def expire_text(self, body: Any) -> dict[str, Any] | None:
        """An expiry broadcast: nobody to answer, so invalid items are logged and counted, not refused."""
        if isinstance(body, bytes | bytearray):
            body = bytes(body).decode("utf-8", "replace")
        if isinstance(body, list):
            body = ";".join(str(item) for item in body)
        if not isinstance(body, str):
            self.qm.stats.count("invalid_expiry_messages")
            log.warning("expiry message is not text", body_type=type(body).__name__)
            return None
        return self.qm.expire(body, strict=False)

    # -- dispatch -------------------------------------------------------------------------------------

    async def _dispatch_loop(self) -> None:
        while True:
            await self.qm.work_available.wait()
            self.qm.work_available.clear()
            for thread, metatile in self.qm.next_assignments():
                self._call_soon(self._send_render(thread, metatile))

    def _call_soon(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    async def _send_render(self, thread: RenderThread, metatile: Metatile) -> None:
        try:
            await self.unit.call(thread.endpoint, {"command": "render", "metatile": str(metatile)},
                                 timeout=self.settings.dispatch_timeout)
        except NoServer:
            self.qm.renderer_lost(thread, "no_server on render")
        except RequestFailed as exc:  # refused (busy, stopping): put back, let pings tell its state
            log.warning("render refused", renderer=thread.endpoint, metatile=str(metatile), error=str(exc))
            self.qm.dispatch_refused(thread, metatile)
        except QBrokerError as exc:  # timeout or connection trouble: we cannot know; treat it as gone
            self.qm.renderer_lost(thread, f"render not accepted: {exc}")
        else:
            if thread.metatile == metatile:
                thread.pending = False

    # -- liveness -------------------------------------------------------------------------------------

    async def _liveness_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.ping_interval)
            for thread in self.qm.renderers:
                if not thread.ping_in_flight:
                    self._call_soon(self._ping(thread))

    async def _ping(self, thread: RenderThread) -> None:
        # NoServer (the exclusive queue vanished with the process) is the fast, usual death signal; the
        # generous timeout only catches hung processes, and must not fire on a merely busy machine.
        thread.ping_in_flight = True
        try:
            reply = await self.unit.call(thread.endpoint, {"command": "ping"},
                                         timeout=max(self.settings.ping_interval * 3, 5.0))
        except NoServer:
            self.qm.renderer_lost(thread, "no_server on ping")
            return
        except (CallTimeout, QBrokerError) as exc:
            thread.missed_pings += 1
            if thread.missed_pings >= self.settings.ping_misses:
                self.qm.renderer_lost(thread, f"{thread.missed_pings} pings unanswered: {exc}")
            return
        finally:
            thread.ping_in_flight = False
        thread.missed_pings = 0
        # A thread refused as busy stays out of rotation until it says it is idle.
        if thread.pending and thread.metatile is None and isinstance(reply, dict) \
                and reply.get("state") == "idle":
            thread.pending = False
            self.qm.work_available.set()

    # -- lifecycle ------------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.unit.start()
        self._tasks = [asyncio.create_task(self._dispatch_loop()),
                       asyncio.create_task(self._liveness_loop())]
        await self.announce()

    async def announce(self) -> None:
        """Tell every renderer to (re)register: on `toposm` (qbroker) and on the seed's osm exchange."""
        await self.unit.alert("toposm", ONLINE)
        await self.osm.publish_online()

    async def stop(self) -> None:
        for task in [*self._tasks, *self._calls]:
            task.cancel()
        self.qm.fail_waiters()  # answered while the unit can still reply
        await self.unit.stop(drain_timeout=2)
        self.qm.close()
