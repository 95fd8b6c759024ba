"""What the operator sees: the latest queuemaster stats, render threads with their rates, recent renders
and failures, Spark jobs and dead letters, as one JSON-able snapshot with a version for live updates.

Everything here is fed by the collector (bus polls and alerts, the render log); nothing here does I/O.
Every list is bounded: the bus may be hostile, and the page must stay small.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from services.toposm import render_log
from services.toposm.tilemath import Metatile, Tile, TileError, parse_metatile

from .bounds import MAX_ITEMS, as_count, clip, records, top_n
from .plain_words import dead_letter_meaning
from .source_health import SourceHealth

# What the page shows of a render-log record (the zoom is in the metatile).
SHOWN_RENDER_FIELDS = tuple(n for n in render_log.FIELD_NAMES if n != "zoom")

MAX_ZOOMS = 32  # zoom labels kept (0-31; anything else the bus sends ends in `other`)
RATE_WINDOW = 60.0  # seconds of samples behind a render thread's renders/minute
MAX_RECENT = 50
MAX_JOBS = 100
MAX_TRACKED_METATILES = 20_000


@dataclass
class ThreadRate:
    """(time, rendered count) samples of one render thread, for its renders per minute."""

    samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=120))

    def add(self, now: float, rendered: int) -> None:
        if self.samples and rendered < self.samples[-1][1]:
            self.samples.clear()  # the thread re-registered: its counter restarted
        self.samples.append((now, rendered))
        while len(self.samples) > 1 and now - self.samples[0][0] > RATE_WINDOW:
            self.samples.popleft()

    def per_minute(self) -> float:
        if len(self.samples) < 2:
            return 0.0
        (t0, n0), (t1, n1) = self.samples[0], self.samples[-1]
        return round((n1 - n0) * 60.0 / (t1 - t0), 2) if t1 > t0 else 0.0


class MetatileTracker:
    """Metatiles this service knows to be expired or requested and not rendered since, for the map overlay
    and for serving a stale tile at once. Bounded (oldest forgotten first)."""

    def __init__(self, limit: int = MAX_TRACKED_METATILES) -> None:
        self.limit = limit
        self._items: OrderedDict[Metatile, tuple[str, float]] = OrderedDict()

    def mark(self, metatile: Metatile, state: str, when: float | None = None) -> None:
        self._items[metatile] = (state, when if when is not None else time.time())
        self._items.move_to_end(metatile)
        while len(self._items) > self.limit:
            self._items.popitem(last=False)

    def expired_at(self, metatile: Metatile) -> float | None:
        item = self._items.get(metatile)
        return item[1] if item is not None else None

    def prune_rendered(self, mtime_of: Callable[[Metatile], float | None]) -> None:
        """Forget metatiles whose tiles were written after they expired (whoever asked for the render)."""
        for metatile, (_, when) in list(self._items.items()):
            mtime = mtime_of(metatile)
            if mtime is not None and mtime >= when:
                del self._items[metatile]

    def done(self, metatile: Metatile) -> None:
        self._items.pop(metatile, None)

    def items(self) -> list[tuple[Metatile, str]]:
        return [(m, state) for m, (state, _) in self._items.items()]

    def __len__(self) -> int:
        return len(self._items)


class StatusModel:
    def __init__(self) -> None:
        self.version = 0
        self.changed = asyncio.Condition()
        self.queuemaster: dict[str, Any] | None = None  # its last stats answer (stale while it does not answer)
        self.queuemaster_health = SourceHealth()
        self.rates: dict[str, ThreadRate] = {}
        self.recent: deque[dict[str, Any]] = deque(maxlen=MAX_RECENT)
        self.failures: deque[dict[str, Any]] = deque(maxlen=MAX_RECENT)
        self.renders_by_renderer: dict[str, int] = {}
        self.failures_by_renderer: dict[str, int] = {}
        self.jobs: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.spark_health = SourceHealth()
        self.dead_letters: dict[str, float] = {}
        self.units: list[dict[str, Any]] = []
        self.tracker = MetatileTracker()
        self.updated = 0.0
        # A live page that hears nothing for this long says so (the collector sets it from its poll timing).
        self.updates_within = 30.0

    @property
    def queuemaster_error(self) -> str | None:
        """Why the queuemaster does not answer, in plain words; None when it does (or before the first poll)."""
        return self.queuemaster_health.problem

    @property
    def jobs_error(self) -> str | None:
        return self.spark_health.problem

    async def touch(self) -> None:
        """Wake every live page (SSE stream)."""
        self.version += 1
        self.updated = time.time()
        async with self.changed:
            self.changed.notify_all()

    # -- feeds -----------------------------------------------------------------------------------------

    def set_queuemaster(
        self, stats: dict[str, Any] | None, error: str | None = None, detail: str | None = None
    ) -> None:
        """Its stats answer, or None and why there is none (``error`` in plain words, ``detail`` technical)."""
        now = time.time()
        if stats is not None:
            for thread in records(stats.get("renderers")):
                name = str(thread.get("renderer"))
                rendered = as_count(thread.get("rendered"))
                self.rates.setdefault(name, ThreadRate()).add(now, rendered)
                self.renders_by_renderer[name] = max(self.renders_by_renderer.get(name, 0), rendered)
            alive = {str(t.get("renderer")) for t in records(stats.get("renderers"))}
            for gone in set(self.rates) - alive:
                del self.rates[gone]
        self.queuemaster = stats if stats is not None else self.queuemaster
        if stats is not None and error is None:
            self.queuemaster_health.answered(now)
        else:
            self.queuemaster_health.failed(error or "no answer", detail)

    def _rendered(self, metatile_text: str, start: Any) -> None:
        """A render that started after the metatile expired makes it fresh; an older one does not."""
        try:
            metatile = parse_metatile(metatile_text)
        except TileError:
            return
        expired_at = self.tracker.expired_at(metatile)
        if expired_at is not None and isinstance(start, int | float) and start >= expired_at:
            self.tracker.done(metatile)

    def add_render(self, record: dict[str, Any]) -> None:
        """One finished render (a render-log record: metatile, renderer, start, duration, status, reason)."""
        renderer = str(record.get("renderer", "unknown"))
        entry = {k: record.get(k) for k in SHOWN_RENDER_FIELDS}
        if record.get("status") == render_log.STATUS_OK:
            self.recent.appendleft(entry)
            self._rendered(str(record.get("metatile", "")), record.get("start"))
        else:
            self.failures.appendleft(entry)
            self.failures_by_renderer[renderer] = self.failures_by_renderer.get(renderer, 0) + 1

    def set_jobs(self, jobs: list[dict[str, Any]] | None, error: str | None = None, detail: str | None = None) -> None:
        if jobs is None:
            self.spark_health.failed(error or "no answer", detail)
            return
        self.spark_health.answered()
        for job in reversed(jobs[:MAX_JOBS]):  # the bridge lists newest first; kept here oldest first
            job_id = str(job.get("job_id"))
            self.jobs[job_id] = {**self.jobs.get(job_id, {}), **job}
        while len(self.jobs) > MAX_JOBS:
            self.jobs.popitem(last=False)

    def job_progress(self, snapshot: dict[str, Any]) -> None:
        job_id = str(snapshot.get("job_id"))
        job = self.jobs.setdefault(job_id, {"job_id": job_id})
        job.update(
            {k: snapshot[k] for k in ("kind", "state", "phase", "counters", "spark", "elapsed") if k in snapshot}
        )
        while len(self.jobs) > MAX_JOBS:
            self.jobs.popitem(last=False)

    def set_units(self, units: list[dict[str, Any]]) -> None:
        self.units = [unit for unit in units if isinstance(unit, dict)]
        totals: dict[str, int] = {}
        for unit in units:
            for key, count in (unit.get("dead_letters") or {}).items():
                if isinstance(count, int):
                    totals[str(key)] = totals.get(str(key), 0) + count
        self.dead_letters = top_n(totals)  # keys come from any unit on the bus: bounded (bounds.py)

    def mark_expired(self, tiles: list[Tile]) -> None:
        now = time.time()
        for metatile in dict.fromkeys(t.metatile for t in tiles):
            self.tracker.mark(metatile, "expired", now)

    # -- views -----------------------------------------------------------------------------------------

    def queues(self) -> dict[str, Any]:
        q = (self.queuemaster or {}).get("queues")
        q = q if isinstance(q, dict) else {}
        raw = q.get("by_zoom")
        by_zoom = top_n(raw if isinstance(raw, dict) else {}, MAX_ZOOMS)
        return {
            "missing": as_count(q.get("missing")),
            "important": as_count(q.get("important")),
            "expired": sum(by_zoom.values()),
            "expired_by_zoom": by_zoom,
            "bulk": as_count(q.get("bulk")),
            "total": as_count(q.get("total")),
            "rendering": as_count(q.get("rendering")),
        }

    def renderers(self) -> list[dict[str, Any]]:
        out = []
        for thread in records((self.queuemaster or {}).get("renderers")):
            name = str(thread.get("renderer"))
            rate = self.rates.get(name)
            out.append(
                {
                    **clip(thread),
                    "rate_per_minute": rate.per_minute() if rate else 0.0,
                    "failures": self.failures_by_renderer.get(name, 0),
                }
            )
        return out

    def snapshot(self) -> dict[str, Any]:
        qm = self.queuemaster or {}
        jobs = list(reversed(self.jobs.values()))
        now = time.time()
        return {
            "version": self.version,
            "updated": round(self.updated, 3),
            "updates_within": self.updates_within,
            "queuemaster": {
                **self.queuemaster_health.view(now),
                "counters": clip(qm.get("counters", {})),
                "waiting_requests": clip(qm.get("waiting_requests", 0)),
                "zoom_range": clip(qm.get("zoom_range")),
                "uptime": clip(qm.get("uptime")),
            },
            "queues": self.queues(),
            "renderers": self.renderers(),
            "recent_renders": clip(list(self.recent)[:20]),
            "recent_failures": clip(list(self.failures)[:20]),
            "spark": {**self.spark_health.view(now), "jobs": clip(jobs[:30])},
            "dead_letters": self.dead_letters,
            "dead_letter_meanings": {
                key: {"meaning": m.meaning, "level": m.level}
                for key in self.dead_letters
                for m in (dead_letter_meaning(key),)
            },
            "units": clip([{k: u.get(k) for k in ("app", "host", "pid", "uptime")} for u in self.units[:MAX_ITEMS]]),
            "overlay_metatiles": len(self.tracker),
        }
