"""toposm-web as a service on a unit: the constructor registers the bus listeners (before ``unit.start()``),
``start()`` starts the polls and the HTTP server, ``stop()`` stops both gracefully.

This is the shape ``qbroker.runner.serve(app, make_service)`` expects (``make_service(unit) -> Service``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from aiohttp import web

from qbroker import Unit
from qbroker.metrics import instrument
from services.toposm.tile_store import open_tile_store
from services.toposm.tilemath import ZoomRange

from .access_log import CombinedAccessLogger, open_access_log
from .app import WebApp
from .cache_policy import CachePolicy
from .collector import Collector
from .front import FrontSettings, NginxFront
from .status import StatusModel
from .tiles import OnDemandLimits, TileServer
from .web_metrics import WebMetrics

log = structlog.get_logger("toposm.web")
APP = "toposm.web"
DRAIN_TIMEOUT = 2.0  # seconds from SIGTERM to exit, whatever is in flight


@dataclass
class WebSettings:
    tile_root: Path
    host: str = "127.0.0.1"
    port: int = 8080  # 0: any free port (see WebService.url)
    render_log: Path | None = None
    zooms: ZoomRange = ZoomRange(0, 18)
    poll_interval: float = 1.0
    drain_timeout: float = DRAIN_TIMEOUT
    limits: OnDemandLimits = field(default_factory=OnDemandLimits)
    cache: CachePolicy = field(default_factory=CachePolicy)
    front: str | None = None  # "nginx": nginx answers on the port, this server behind it (front.py)
    front_workers: int = 0  # nginx worker processes (0: one per core)
    tile_store: str = "png"  # png or meta (services/toposm/tile_store.py)
    access_log: str | None = None  # a file or "-" (standard output), Combined Log Format (access_log.py)


class WebService:
    def __init__(self, unit: Unit, settings: WebSettings) -> None:
        self.unit = unit
        self.settings = settings
        self.status = StatusModel()
        self.metrics = WebMetrics(self.status)
        instrument(unit, self.metrics.library)
        self.collector = Collector(
            unit,
            self.status,
            self.metrics,
            zooms=settings.zooms,
            poll_interval=settings.poll_interval,
            render_log=settings.render_log,
        )
        self.tiles = TileServer(
            open_tile_store(settings.tile_root, settings.tile_store), self.collector, self.status, settings.limits
        )
        self.collector.expired_listeners.append(self.tiles.expired)
        self.web = WebApp(
            self.status,
            self.metrics,
            self.tiles,
            settings.zooms,
            settings.cache,
            behind_front=settings.front is not None,
        )
        self.front: NginxFront | None = None
        self._runner: web.AppRunner | None = None
        self.port = settings.port

    @property
    def url(self) -> str:
        host = self.settings.host if self.settings.host not in ("0.0.0.0", "::") else "127.0.0.1"  # noqa: S104
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        """After ``unit.start()``: poll the bus and serve HTTP."""
        self.collector.start()
        # aiohttp waits up to shutdown_timeout twice (for handlers to end, then after cancelling them): the
        # HTTP side gets at most half of the drain timeout (main.py gives the unit's drain the other half).
        # Behind the front, nginx logs every request (its own hits too): toposm-web logs none.
        logged = self.settings.access_log if self.settings.front is None else None
        self._runner = web.AppRunner(
            self.web.build(),
            access_log_class=CombinedAccessLogger,
            access_log=open_access_log(logged) if logged else None,
            shutdown_timeout=self.settings.drain_timeout / 8,
        )
        await self._runner.setup()
        if self.settings.front == "nginx":
            await self._start_behind_front()
        else:
            site = web.TCPSite(self._runner, self.settings.host, self.settings.port)
            await site.start()
            server = getattr(site, "_server", None)  # the bound port when asked for port 0
            if server is not None and server.sockets:
                self.port = server.sockets[0].getsockname()[1]
        log.info("toposm-web serving", status_page=f"{self.url}/", map=f"{self.url}/map", metrics=f"{self.url}/metrics")

    async def _start_behind_front(self) -> None:
        s = self.settings
        assert self._runner is not None
        self.front = NginxFront(
            FrontSettings(
                host=s.host,
                port=s.port,
                tile_root=s.tile_root,
                cache=s.cache,
                workers=s.front_workers,
                read_timeout=s.limits.timeout + 30,
                access_log=s.access_log,
            )
        )
        self.front.prepare()
        await web.UnixSite(self._runner, str(self.front.backend)).start()
        self.front.backend_ready()
        await self.front.start()
        self.port = self.front.port

    async def stop(self) -> None:
        """Bounded whatever is in flight (a flood of tile requests, a queuemaster that is gone): renders are
        cancelled first, so the requests waiting for them answer 503 at once, then the live streams end."""
        self.web.closing.set()
        await self.tiles.close(timeout=self.settings.drain_timeout / 8)
        await self.status.touch()  # ends the live streams
        if self.front is not None:  # quit, terminate, kill: a sixteenth of the drain timeout each at most
            await self.front.stop(grace=self.settings.drain_timeout / 16)
        if self._runner is not None:
            try:
                async with asyncio.timeout(self.settings.drain_timeout / 4):
                    await self._runner.cleanup()
            except TimeoutError:
                log.warning("HTTP connections still open at the drain timeout; closing anyway")
        await self.collector.stop(timeout=self.settings.drain_timeout / 8)
