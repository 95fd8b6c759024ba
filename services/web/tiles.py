"""Serving ``/tiles/z/x/y.png`` from the tile store with render on demand, like mod_tile.

* a fresh tile is served from the store;
* a dirty tile (its metatile expired after the file was written) is served at once and a render queued;
* a missing tile is requested from the queuemaster (``render``) and served when rendered, within a timeout.

Which is which comes from the tile root itself (services/toposm/freshness.py): expiry timestamps on disk,
written here for every expiry list seen on the bus, so a restart or another server of the same root
(the nginx front) sees the same state.

On-demand renders are bounded: one ``render`` call per metatile however many requests want it, at most
``per_client`` metatiles in flight per client address (HTTP 429 beyond) and ``total`` metatiles in flight
(HTTP 503 beyond). Nothing queues without bound here; the queuemaster's own queue is the only queue.

A re-render (the map's click, ``POST /api/render``) is admitted by the same budgets *before* anything is
sent: a refused request reaches the queuemaster not at all. Admitted, it joins a render already in flight
for its metatile (nothing sent), is a no-op for a metatile re-rendered on request less than
``rerender_interval`` ago and not expired since, and
costs one of its client's ``rerenders_per_minute``; only then are ``expire`` and ``render`` sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from limits import RateLimitItemPerMinute
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

from qbroker import CallTimeout, QBrokerError
from services.toposm.contract import QUEUEMASTER
from services.toposm.freshness import FreshnessStore, TileState
from services.toposm.messages import ExpireRequest, RenderTileRequest
from services.toposm.tile_store import TileStore
from services.toposm.tilemath import Metatile, Tile

from .collector import Collector
from .plain_words import unavailable, why_no_answer
from .status import MAX_TRACKED_METATILES, StatusModel

log = structlog.get_logger("toposm.web")
EXPIRE_TIMEOUT = 5.0  # seconds for the queuemaster to confirm a click's expiry


class TileRefused(Exception):
    """The tile cannot be served now: ``status`` is the HTTP status, the message says why. ``unavailable``:
    renders are unavailable (the queuemaster does not answer), not this request refused."""

    def __init__(self, status: int, message: str, retry_after: int | None = None, *, unavailable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after
        self.unavailable = unavailable


def renders_unavailable(problem: str | None) -> TileRefused:
    return TileRefused(
        503, f"renders unavailable: {problem or 'the queuemaster does not answer'}", retry_after=10, unavailable=True
    )


def refusal(exc: QBrokerError, what: str) -> TileRefused:
    """The answer to a call to the queuemaster that failed: 503 when it never got there, 502 when it refused."""
    if unavailable(exc):
        return renders_unavailable(why_no_answer(exc, "the queuemaster", QUEUEMASTER))
    return TileRefused(502, f"{what} failed: {why_no_answer(exc, 'the queuemaster', QUEUEMASTER)}")


@dataclass
class ServedTile:
    path: Path
    state: TileState  # missing: it was, and has been rendered for this request
    mtime: float

    @property
    def age(self) -> float:
        return time.time() - self.mtime


@dataclass
class OnDemandLimits:
    per_client: int = 8
    total: int = 64
    timeout: float = 30.0
    rerender_interval: float = 60.0  # seconds: a metatile re-rendered more recently is not re-rendered again
    rerenders_per_minute: int = 30  # per client address


class TileServer:
    def __init__(self, store: TileStore, collector: Collector, status: StatusModel, limits: OnDemandLimits) -> None:
        self.store = store
        self.freshness = FreshnessStore(store)
        self.collector = collector
        self.status = status
        self.limits = limits
        self.renders: dict[Metatile, asyncio.Task[Any]] = {}
        # client -> metatiles it waits for (with a count of its requests for each): the budget is renders,
        # so the 64 tiles of one metatile that a map view asks for at once cost one slot, not 64.
        self.per_client: dict[str, Counter[Metatile]] = {}
        # Moving window per client address (limits' memory storage forgets idle clients by itself).
        self.rerender_rate = RateLimitItemPerMinute(limits.rerenders_per_minute)
        self.rerender_limiter = MovingWindowRateLimiter(MemoryStorage())
        self.closing = False
        self.rerendered: OrderedDict[Metatile, float] = OrderedDict()  # last re-render asked, oldest first

    @property
    def in_flight(self) -> int:
        return len(self.renders)

    def metatile_mtime(self, metatile: Metatile) -> float | None:
        return self._mtime(metatile.top_left)  # a render writes all of a metatile's tiles together

    def _mtime(self, tile: Tile) -> float | None:
        try:
            return self.store.path(tile).stat().st_mtime
        except OSError:
            return None

    async def get(self, tile: Tile, client: str) -> ServedTile:
        metatile = tile.metatile
        found = self.freshness.state(tile)
        if found.state == "fresh" and found.mtime is not None:
            self.status.tracker.done(metatile)
            return ServedTile(found.path, "fresh", found.mtime)
        if found.state == "dirty" and found.mtime is not None:
            with contextlib.suppress(TileRefused):  # a full render budget must not hide the dirty tile
                self.start(tile, client)
            return ServedTile(found.path, "dirty", found.mtime)
        await self.renders_available(metatile, client)
        task = self.start(tile, client, waiting=True)
        try:
            await asyncio.wait_for(asyncio.shield(task), self.limits.timeout)
        except (TimeoutError, CallTimeout):  # the call's own deadline is the render timeout
            raise TileRefused(
                503, f"tile {tile} is queued but not rendered within {self.limits.timeout:g}s", retry_after=5
            ) from None
        except QBrokerError as exc:
            raise refusal(exc, f"render of {tile}") from None
        except asyncio.CancelledError:
            if task.cancelled():  # the render was cancelled (toposm-web is stopping), not this request
                raise TileRefused(503, "toposm-web is stopping", retry_after=5) from None
            raise
        finally:
            self._release(client, metatile)
        mtime = self._mtime(tile)
        if mtime is None:
            raise TileRefused(404, f"tile {tile} was rendered but is not in the tile store")
        return ServedTile(self.store.path(tile), "missing", mtime)

    async def expired(self, tiles: list[Tile]) -> None:
        """An expiry list from the bus: timestamp its metatiles in the tile root (off the event loop)."""
        try:
            await asyncio.to_thread(self.freshness.expire, [t.metatile for t in tiles])
        except OSError as exc:
            log.error("cannot record expired metatiles in the tile root", error=str(exc), tiles=len(tiles))

    async def renders_available(self, metatile: Metatile, client: str) -> None:
        """Refuse at once (503, ``unavailable``) what would wait for a queuemaster that does not answer,
        instead of holding a render slot until the render timeout. Admission first: a request over its
        budget is told so without waiting for the queuemaster's word."""
        self.admit(metatile, client)
        if metatile not in self.renders and not await self.collector.queuemaster_answers():
            raise renders_unavailable(self.status.queuemaster_error)

    def admit(self, metatile: Metatile, client: str) -> None:
        """Raise TileRefused unless ``client`` may wait for ``metatile`` now (joining a render in flight
        costs no total budget, but a slot of the client's own)."""
        if self.closing:
            raise TileRefused(503, "toposm-web is stopping", retry_after=5)
        mine = self.per_client.get(client, ())
        if metatile not in mine and len(mine) >= self.limits.per_client:
            raise TileRefused(
                429, f"too many renders in flight for this client (limit {self.limits.per_client})", retry_after=5
            )
        if metatile not in self.renders and len(self.renders) >= self.limits.total:
            raise TileRefused(503, f"render budget exhausted ({self.limits.total} metatiles in flight)", retry_after=5)

    def start(
        self, tile: Tile, client: str, *, waiting: bool = False, expired: asyncio.Future[None] | None = None
    ) -> asyncio.Task[Any]:
        """Join the render of the tile's metatile, or start one if the budgets allow. A waiting request
        holds its client's slot until it returns; a background render until it finishes. ``expired``: a
        new render expires the metatile first and resolves the future with the outcome of that."""
        metatile = tile.metatile
        self.admit(metatile, client)
        mine = self.per_client.setdefault(client, Counter())
        task = self.renders.get(metatile)
        if task is None:
            task = asyncio.create_task(self._render(tile, expired))
            self.renders[metatile] = task
            task.add_done_callback(lambda done: self._finished(metatile, done))
            self.status.tracker.mark(metatile, "requested")
            self.collector.wake.set()
        mine[metatile] += 1
        if not waiting:
            task.add_done_callback(lambda _: self._release(client, metatile))
        return task

    async def _render(self, tile: Tile, expired: asyncio.Future[None] | None = None) -> Any:
        if expired is not None:
            try:
                await self.collector.call(QUEUEMASTER, ExpireRequest(tiles=str(tile)).body(), timeout=EXPIRE_TIMEOUT)
            except BaseException as exc:
                if not expired.done():
                    expired.set_exception(exc) if isinstance(exc, Exception) else expired.cancel()
                raise
            expired.set_result(None)
        # The call's own deadline is the render timeout: a longer render keeps its place in the queue.
        return await self.collector.call(
            QUEUEMASTER, RenderTileRequest(tile=str(tile)).body(), timeout=self.limits.timeout
        )

    def _finished(self, metatile: Metatile, task: asyncio.Task[Any]) -> None:
        if self.renders.get(metatile) is task:
            del self.renders[metatile]
        if not task.cancelled() and task.exception() is None:
            self.status.tracker.done(metatile)
        self.collector.wake.set()

    def _release(self, client: str, metatile: Metatile) -> None:
        mine = self.per_client.get(client)
        if mine is None:
            return
        mine[metatile] -= 1
        if mine[metatile] <= 0:
            del mine[metatile]
        if not mine:
            del self.per_client[client]

    async def rerender(self, tile: Tile, client: str) -> tuple[int, dict[str, Any]]:
        """A click on the map: expire the tile's metatile (so a fresh one renders again) and queue it.
        Every check comes before anything is sent (module docstring); returns (HTTP status, answer)."""
        metatile = tile.metatile
        answer: dict[str, Any] = {"tile": str(tile), "metatile": str(metatile), "state": "queued"}
        await self.renders_available(metatile, client)
        if metatile in self.renders:  # queued already: joining it sends nothing
            self.start(tile, client)
            return 202, answer
        found = self.freshness.state(tile)
        asked = self.rerendered.get(metatile)
        if found.state == "fresh" and asked is not None and time.time() - asked < self.limits.rerender_interval:
            # re-rendered on request a moment ago and not expired since: again would change nothing
            return 200, {**answer, "state": "fresh", "age": round(time.time() - asked, 1)}
        if not self.rerender_limiter.hit(self.rerender_rate, client):
            raise TileRefused(
                429,
                f"too many re-renders for this client (limit {self.limits.rerenders_per_minute} a minute)",
                retry_after=10,
            )
        expired: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.start(tile, client, expired=expired)
        self.rerendered[metatile] = time.time()
        self.rerendered.move_to_end(metatile)
        while len(self.rerendered) > MAX_TRACKED_METATILES:
            self.rerendered.popitem(last=False)
        try:
            await asyncio.wait_for(asyncio.shield(expired), EXPIRE_TIMEOUT * 2)
        except TimeoutError:
            raise renders_unavailable(
                f"the queuemaster did not confirm the expiry within {EXPIRE_TIMEOUT * 2:g} s"
            ) from None
        except QBrokerError as exc:
            raise refusal(exc, f"expiry of {tile}") from None
        except asyncio.CancelledError:
            if expired.cancelled():  # the render was cancelled (toposm-web is stopping), not this request
                raise TileRefused(503, "toposm-web is stopping", retry_after=5) from None
            raise
        if found.mtime is not None:
            await self.expired([tile])
            self.status.tracker.mark(metatile, "expired")
        return 202, answer

    async def close(self, timeout: float = 1.0) -> None:
        """Cancel every render in flight: the requests waiting for them are answered 503 at once."""
        self.closing = True
        tasks = list(self.renders.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
