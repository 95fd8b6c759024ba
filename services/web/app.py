"""The HTTP face of toposm-web (aiohttp): pages, live events, the JSON API, tiles and metrics.

Errors never show a stack trace: HTTP errors answer a short text, anything unexpected is logged with the
request's correlation id and answered 500 "internal error".
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from email.utils import formatdate
from pathlib import Path

import orjson
import structlog
from aiohttp import web

from services.toposm.tilemath import Tile, TileError, ZoomRange, parse_tile

from .cache_policy import NO_STORE, CachePolicy
from .extent import SharedScan, tile_root_extent
from .same_origin import add_security_headers, same_origin_middleware
from .status import StatusModel
from .tiles import TileRefused, TileServer
from .web_metrics import WebMetrics

log = structlog.get_logger("toposm.web")
STATIC = Path(__file__).parent / "static"
FAVICON = STATIC / "favicon.ico"
# What a browser's map gets instead of a 503 while renders are unavailable, when its tile URL asks for it
# (``?placeholder=1``: the map's own layer does; other clients keep the 503): a grey hatched tile, no-store.
PLACEHOLDER_PARAM = "placeholder"
PLACEHOLDER_TILE = (STATIC / "tile-unavailable.png").read_bytes()
MAX_OVERLAY = 5000
MAX_LIVE_CLIENTS = 100
# One address gets at most this share of the live streams, so one host opening hundreds cannot lock
# every other viewer out (it gets 429; a full house 503).
MAX_LIVE_PER_ADDRESS = MAX_LIVE_CLIENTS // 10
KEEPALIVE = 15.0
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_response(data: object, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json", headers=headers)


def retry_after(exc: TileRefused) -> dict[str, str]:
    return {"Retry-After": str(exc.retry_after)} if exc.retry_after else {}


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    correlation_id = uuid.uuid4().hex
    with structlog.contextvars.bound_contextvars(correlation_id=correlation_id):
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status >= 400 and exc.text is None:
                exc.text = f"{exc.status}: {exc.reason}\n"
            raise
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("request failed", path=request.path)
            return web.Response(status=500, text=f"internal error (correlation id {correlation_id})\n")


def client_of(request: web.Request, *, behind_front: bool = False) -> str:
    # The peer address, not X-Forwarded-For: a header anyone can forge would defeat the per-client cap.
    # Behind toposm-web's own front the peer is always the front (it alone reaches the backend's socket,
    # see front.py), which sets X-Real-IP to the client's address, overwriting any the client sent.
    if behind_front:
        return request.headers.get("X-Real-IP") or "unknown"
    return request.remote or "unknown"


class WebApp:
    def __init__(
        self,
        status: StatusModel,
        metrics: WebMetrics,
        tiles: TileServer,
        zooms: ZoomRange,
        cache: CachePolicy | None = None,
        *,
        behind_front: bool = False,
    ) -> None:
        self.cache = cache or CachePolicy()
        self.behind_front = behind_front
        self.status = status
        self.metrics = metrics
        self.tiles = tiles
        self.zooms = zooms
        self.live_clients = 0
        self.live_by_address: Counter[str] = Counter()
        self.closing = asyncio.Event()
        self.extent = SharedScan(lambda: tile_root_extent(tiles.store))
        metrics.on_demand.set_function(lambda: tiles.in_flight)

    def build(self) -> web.Application:
        app = web.Application(middlewares=[errors_middleware, same_origin_middleware], client_max_size=64 * 1024)
        app.on_response_prepare.append(add_security_headers)
        app.router.add_get("/", self.page("status.html"))
        app.router.add_get("/map", self.page("map.html"))
        app.router.add_get("/events", self.events)
        app.router.add_get("/api/status", self.api_status)
        app.router.add_get("/api/overlay", self.api_overlay)
        app.router.add_get("/api/extent", self.api_extent)
        app.router.add_post("/api/render", self.api_render)
        app.router.add_get("/tiles/{z}/{x}/{y}.png", self.tile)
        app.router.add_get("/metrics", self.prometheus)
        app.router.add_get("/favicon.ico", self.favicon)
        app.router.add_static("/static/", STATIC, show_index=False, follow_symlinks=False)
        return app

    def page(self, name: str) -> Handler:
        async def serve(request: web.Request) -> web.StreamResponse:
            return web.FileResponse(STATIC / name, headers={"Cache-Control": "no-cache"})

        return serve

    def parse_tile(self, text: str) -> Tile:
        try:
            return parse_tile(text, self.zooms)
        except TileError as exc:
            raise web.HTTPBadRequest(text=f"400: {exc}\n") from None

    async def tile(self, request: web.Request) -> web.StreamResponse:
        m = request.match_info
        tile = self.parse_tile(f"{m['z']}/{m['x']}/{m['y']}")
        try:
            served = await self.tiles.get(tile, self.client(request))
        except TileRefused as exc:
            self.metrics.tile_requests.labels(f"refused_{exc.status}").inc()
            if exc.unavailable and request.query.get(PLACEHOLDER_PARAM) == "1":
                return web.Response(
                    body=PLACEHOLDER_TILE, content_type="image/png", headers={**NO_STORE, "X-Tile-State": "unavailable"}
                )
            headers = {**NO_STORE, "X-Tile-State": "unavailable" if exc.unavailable else "missing", **retry_after(exc)}
            return web.Response(status=exc.status, text=f"{exc.status}: {exc.message}\n", headers=headers)
        self.metrics.tile_requests.labels(served.state).inc()
        # A tile rendered for this request is as fresh as can be; only a dirty one gets the short max-age.
        cache_state = "dirty" if served.state == "dirty" else "fresh"
        headers = {
            **self.cache.headers(tile.z, cache_state, served.age, time.time()),
            "X-Tile-State": served.state,
            "Content-Type": "image/png",
        }
        if self.tiles.store.kind == "png":
            return web.FileResponse(served.path, headers=headers)  # sendfile, ETag and 304s by aiohttp
        return await self.tile_from_metatile_file(request, tile, served.mtime, headers)

    async def tile_from_metatile_file(
        self, request: web.Request, tile: Tile, mtime: float, headers: dict[str, str]
    ) -> web.Response:
        """A tile out of its ``.meta`` file (``--tile-store meta``), with the validators FileResponse gives a
        PNG file: an ETag of the file's mtime and the tile's size, Last-Modified, and 304 on a match."""
        data = await asyncio.to_thread(self.tiles.store.read, tile)
        if data is None:  # replaced by an unreadable file since the stat, or damaged
            return web.Response(
                status=404,
                text=f"404: tile {tile} is not in its metatile file\n",
                headers={**NO_STORE, "X-Tile-State": "missing"},
            )
        etag = f"{int(mtime * 1_000_000):x}-{len(data):x}"
        modified = datetime.fromtimestamp(int(mtime), UTC)
        headers = {**headers, "ETag": f'"{etag}"', "Last-Modified": formatdate(int(mtime), usegmt=True)}
        if_none_match = request.if_none_match
        if if_none_match is not None:
            if any(e.value == etag or e.value == "*" for e in if_none_match):
                return web.Response(status=304, headers=headers)
        elif request.if_modified_since is not None and modified <= request.if_modified_since:
            return web.Response(status=304, headers=headers)
        return web.Response(body=data, headers=headers)

    def client(self, request: web.Request) -> str:
        return client_of(request, behind_front=self.behind_front)

    async def api_status(self, request: web.Request) -> web.Response:
        return json_response(self.status.snapshot())

    async def api_overlay(self, request: web.Request) -> web.Response:
        await asyncio.to_thread(self.status.tracker.prune_rendered, self.tiles.metatile_mtime)
        items = self.status.tracker.items()[-MAX_OVERLAY:]
        return json_response(
            {
                "metatiles": [{"z": m.z, "mx": m.mx, "my": m.my, "side": m.side, "state": state} for m, state in items],
                "total": len(self.status.tracker),
                "queuemaster": self.status.queuemaster_health.view(),
            }
        )

    async def api_extent(self, request: web.Request) -> web.Response:
        """Where the tile store's data is: the map opens there unless its URL says otherwise."""
        return json_response(await self.extent.get())

    async def api_render(self, request: web.Request) -> web.Response:
        try:
            body = await request.json(loads=orjson.loads)
        except (ValueError, UnicodeDecodeError):
            raise web.HTTPBadRequest(text='400: body must be JSON: {"tile": "z/x/y"}\n') from None
        text = body.get("tile") if isinstance(body, dict) else None
        if not isinstance(text, str):
            raise web.HTTPBadRequest(text='400: body must be JSON: {"tile": "z/x/y"}\n')
        tile = self.parse_tile(text)
        try:
            status, answer = await self.tiles.rerender(tile, self.client(request))
        except TileRefused as exc:
            return json_response({"error": exc.message}, status=exc.status, headers=retry_after(exc))
        return json_response(answer, status=status)

    async def favicon(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(
            FAVICON, headers={"Cache-Control": "public, max-age=86400", "Content-Type": "image/x-icon"}
        )

    async def prometheus(self, request: web.Request) -> web.Response:
        body = await asyncio.to_thread(self.metrics.render)
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def events(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: the whole snapshot whenever it changes (it is small), keep-alive comments."""
        address = self.client(request)
        if self.live_by_address[address] >= MAX_LIVE_PER_ADDRESS:
            raise web.HTTPTooManyRequests(
                text=f"429: too many live streams from this address (limit {MAX_LIVE_PER_ADDRESS})\n",
                headers={"Retry-After": "30"},
            )
        if self.live_clients >= MAX_LIVE_CLIENTS:
            raise web.HTTPServiceUnavailable(text="503: too many live clients\n", headers={"Retry-After": "30"})
        # counted before the first await, so that concurrent requests see each other
        self.live_clients += 1
        self.live_by_address[address] += 1
        self.metrics.sse_clients.set(self.live_clients)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
        try:
            await response.prepare(request)
            seen = -1
            while not self.closing.is_set():
                if self.status.version != seen:
                    seen = self.status.version
                    await response.write(b"data: " + orjson.dumps(self.status.snapshot()) + b"\n\n")
                    continue
                async with self.status.changed:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(KEEPALIVE):  # not wait_for: see Collector._loop
                            await self.status.changed.wait()
                if self.status.version == seen:
                    await response.write(b": keep-alive\n\n")
        except ConnectionResetError:
            pass  # the page was closed
        finally:
            self.live_clients -= 1
            self.live_by_address[address] -= 1
            if self.live_by_address[address] <= 0:
                del self.live_by_address[address]
            self.metrics.sse_clients.set(self.live_clients)
        return response
