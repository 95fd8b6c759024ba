"""The render queue: missing, important and per-zoom background queues of metatiles.

Each metatile is queued at most once (duplicates merge). Its class decides the queue: ``missing``
(requested, never rendered), ``important`` (requested while stale, or raised), ``background`` (expired;
one queue per zoom), ``bulk`` (pre-rendering an area, ``toposm-render-list``; below all others). Within a
queue, metatiles go first in, first out; a metatile put back after its renderer died goes to the front.

The queue lives in its SQLite store (``queue_store``): a pick is one descent of the ``(src, seq)`` index,
O(log n), and raising a metatile moves its row, so nothing stale is left to skip. In memory there are only
the per-queue counts (the strategies read them for every pick) and the metatiles in flight (one per
render thread), so memory does not grow with the queue.

Metatiles handed to a renderer stay known as *in flight* (persisted too) until ``finish`` or ``put_back``.

A ``render`` request queues or raises its metatile with ``request``, which remembers (in memory) the class
the metatile had before; when every request waiting for it has given up, ``abandon`` puts it back there, or
drops it if requests alone had queued it: work nobody waits for must not stay ahead of work somebody does.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Literal

from services.toposm.contract import KEY_ZOOM_SHIFT
from services.toposm.strategy import BULK, IMPORTANT, MISSING
from services.toposm.tilemath import Metatile

from .queue_store import (
    QUEUED,
    RENDERING,
    RENDERING_DIRTY,
    SRC_BULK,
    SRC_IMPORTANT,
    SRC_MISSING,
    QueueStore,
    pack,
    unpack,
)

QueueClass = Literal["missing", "important", "background", "bulk"]
CLASS_RANK: dict[str, int] = {"missing": 0, "important": 1, "background": 2, "bulk": 3}
Source = str | int  # MISSING, IMPORTANT, BULK, or a zoom (background queue)
AddOutcome = Literal["queued", "raised", "merged", "rendering", "marked_dirty"]
AbandonOutcome = Literal["dropped", "lowered"]
_NAMED_SRC = {MISSING: SRC_MISSING, IMPORTANT: SRC_IMPORTANT, BULK: SRC_BULK}
_SRC_CLASS = {SRC_MISSING: "missing", SRC_IMPORTANT: "important", SRC_BULK: "bulk"}


def _src(cls: str, metatile: Metatile) -> int:
    if cls == "background":
        return metatile.z
    return _NAMED_SRC[cls]


def _class_of(src: int) -> str:
    return _SRC_CLASS.get(src, "background")


class RenderQueue:
    """Queued and in-flight metatiles, kept in a QueueStore."""

    def __init__(self, store: QueueStore) -> None:
        self._store = store
        counts, low, high, in_flight = store.summary()
        self._lengths: Counter[int] = Counter(counts)  # queued metatiles per src
        self._back = itertools.count(high + 1)  # seq for appending
        self._front = itertools.count(min(low - 1, -1), -1)  # seq for putting back at the front
        self._rendering: dict[int, tuple[int, bool]] = {}  # key -> (src, dirty) of the metatiles in flight
        # key -> the src a metatile would have without the requests that queued or raised it (None: not
        # queued); raised by bulk requests and expiries that merge into it since. Only requested metatiles.
        self._requested: dict[int, int | None] = {}
        # Its renderer may still be working on it; if it re-registers with this metatile it is claimed
        # back, otherwise it renders again from the front of its queue.
        with store.batch():
            for key, src, _seq in sorted(in_flight, key=lambda row: row[2]):
                store.put(key, src, next(self._front), QUEUED)
                self._lengths[src] += 1

    # -- queries --------------------------------------------------------------------------------------

    def batch(self) -> AbstractContextManager[None]:
        """One persistence transaction for several mutations (e.g. one expiry message)."""
        return self._store.batch()

    def state_of(self, metatile: Metatile) -> str | None:
        """``rendering``, the queued class, or None if the metatile is not known."""
        key = pack(metatile)
        if key in self._rendering:
            return "rendering"
        row = self._store.row(key)
        return None if row is None else _class_of(row[0])

    @property
    def missing(self) -> int:
        return self._lengths[SRC_MISSING]

    @property
    def important(self) -> int:
        return self._lengths[SRC_IMPORTANT]

    @property
    def bulk(self) -> int:
        return self._lengths[SRC_BULK]

    def background_by_zoom(self) -> dict[int, int]:
        return {s: n for s, n in self._lengths.items() if s >= 0 and n > 0}

    def queued_count(self) -> int:
        return sum(self._lengths.values())

    def in_flight(self) -> list[Metatile]:
        return [unpack(key) for key in self._rendering]

    def in_flight_count(self) -> int:
        return len(self._rendering)

    def in_flight_by_class(self) -> Counter[str]:
        """Metatiles in flight by the class they were queued in (one per render thread: a short loop)."""
        return Counter(_class_of(src) for src, _dirty in self._rendering.values())

    def queued(self) -> Iterator[Metatile]:
        """Every queued metatile, in seq order (tests and tools; reads the whole table)."""
        return (unpack(key) for key in self._store.queued_keys())

    # -- mutations ------------------------------------------------------------------------------------

    def add(self, metatile: Metatile, cls: QueueClass) -> AddOutcome:
        """Queue a metatile, merging with what is already queued or rendering."""
        outcome = self._add(metatile, cls)
        if self._requested:
            self._lift_base(pack(metatile), _src(cls, metatile))
        return outcome

    def request(self, metatile: Metatile, cls: QueueClass) -> AddOutcome:
        """``add`` for a waiting request: what the metatile had before is remembered for ``abandon``."""
        key = pack(metatile)
        before = None if key in self._rendering else self._store.row(key)
        outcome = self._add(metatile, cls)
        if outcome in ("queued", "raised"):
            self._requested.setdefault(key, None if before is None else before[0])
        return outcome

    def abandon(self, metatile: Metatile) -> AbandonOutcome | None:
        """Every request waiting for ``metatile`` has given up: take back the place they gave it. Back to
        the class it had without them, at the end of that queue, or out of the queue if they alone queued
        it. Not remembered (requested before a restart): an important one goes back to background, a
        missing one is dropped. A metatile in flight, or queued below the requested classes, stays."""
        key = pack(metatile)
        row = None if key in self._rendering else self._store.row(key)
        if row is None or row[0] not in (SRC_MISSING, SRC_IMPORTANT):
            return None
        known = key in self._requested
        base = self._requested.pop(key, None)
        if not known:
            base = None if row[0] == SRC_MISSING else metatile.z
        self._lengths[row[0]] -= 1
        if base is None:
            self._store.delete(key)
            return "dropped"
        self._lengths[base] += 1
        self._store.put(key, base, next(self._back), QUEUED)
        return "lowered"

    def _lift_base(self, key: int, src: int) -> None:
        """Something other than a request (bulk, an expiry) wants the requested metatile ``key`` at ``src``:
        that is where it goes back to should its requests all give up."""
        if key in self._requested:
            base = self._requested[key]
            if base is None or CLASS_RANK[_class_of(src)] < CLASS_RANK[_class_of(base)]:
                self._requested[key] = src

    def _add(self, metatile: Metatile, cls: QueueClass) -> AddOutcome:
        key = pack(metatile)
        flying = self._rendering.get(key)
        if flying is not None:
            if cls == "background" and not flying[1]:
                # Expired while rendering: the render in progress may predate the change.
                self._rendering[key] = (flying[0], True)
                self._store.set_state(key, RENDERING_DIRTY)
                return "marked_dirty"
            return "rendering"
        row = self._store.row(key)
        src = _src(cls, metatile)
        if row is not None:
            if CLASS_RANK[cls] >= CLASS_RANK[_class_of(row[0])]:
                return "merged"
            self._lengths[row[0]] -= 1
            self._lengths[src] += 1
            self._store.put(key, src, next(self._back), QUEUED)
            return "raised"
        self._lengths[src] += 1
        self._store.put(key, src, next(self._back), QUEUED)
        return "queued"

    def add_expired(
        self, metatiles: Iterable[Metatile], keep_unknown: Callable[[Metatile], bool] | None = None
    ) -> Counter[str]:
        """``add(m, "background")`` for many metatiles at once: ``add_expired_keys`` of their keys."""
        return self.add_expired_keys([pack(m) for m in metatiles], keep_unknown)

    def add_expired_keys(
        self, keys: Iterable[int], keep_unknown: Callable[[Metatile], bool] | None = None
    ) -> Counter[str]:
        """``add(m, "background")`` for many metatiles at once (an expiry message, as packed keys in
        order): a few statements for the whole message, not two per metatile. ``keep_unknown`` decides
        whether a metatile the queue does not know is queued (else it counts as ``not_rendered_yet``);
        None queues them all."""
        outcome: Counter[str] = Counter()
        rendering = self._rendering
        candidates: list[int] = []
        dirty: list[int] = []
        for key in keys:
            flying = rendering.get(key)
            if flying is None:
                candidates.append(key)
            elif flying[1]:
                outcome["rendering"] += 1
            else:
                # Expired while rendering: the render in progress may predate the change.
                rendering[key] = (flying[0], True)
                dirty.append(key)
                outcome["marked_dirty"] += 1
        if self._requested:  # the place the expiry alone would give (a row there for a request does not count)
            for key in candidates:
                if key in self._requested and (keep_unknown is None or keep_unknown(unpack(key))):
                    self._lift_base(key, key >> KEY_ZOOM_SHIFT)
        if keep_unknown is not None:
            known = self._store.known(candidates)
            kept = [key for key in candidates if key in known or keep_unknown(unpack(key))]
            outcome["not_rendered_yet"] += len(candidates) - len(kept)
            candidates = kept
        by_zoom: dict[int, list[int]] = {}
        for key in candidates:
            zoom = key >> KEY_ZOOM_SHIFT
            group = by_zoom.get(zoom)
            if group is None:
                by_zoom[zoom] = [key]
            else:
                group.append(key)
        with self._store.batch():
            for zoom, zoom_keys in by_zoom.items():
                # A row that is there already is queued (in-flight ones were sorted out above); one queued
                # for bulk pre-rendering moves up to background, any other stays as it is ("merged"). The
                # seq it was offered is simply never used.
                first = next(self._back)
                self._back = itertools.count(first + len(zoom_keys))
                raised = self._raise_bulk(zoom_keys, zoom, first) if self._lengths[SRC_BULK] else 0
                queued = self._store.insert_new(zoom_keys, zoom, first)
                self._lengths[zoom] += queued
                outcome["queued"] += queued
                outcome["merged"] += len(zoom_keys) - queued - raised
                if raised:
                    outcome["raised"] += raised
            if dirty:
                self._store.set_states(dirty, RENDERING_DIRTY)
        return outcome

    def _raise_bulk(self, keys: list[int], zoom: int, first_seq: int) -> int:
        """Move the ``keys`` queued for bulk pre-rendering to the background queue of ``zoom``."""
        found = self._store.queued_in(keys, SRC_BULK)
        if found:
            self._store.put_many((key, zoom, first_seq + i, QUEUED) for i, key in enumerate(found))
            self._lengths[SRC_BULK] -= len(found)
            self._lengths[zoom] += len(found)
        return len(found)

    def withdraw_bulk(self, metatiles: list[Metatile]) -> list[Metatile]:
        """Take the metatiles that are queued for bulk pre-rendering out of the queue (a stopped
        ``toposm-render-list``); anything raised since (requested, expired) or in flight stays."""
        found = self._store.queued_in([pack(m) for m in metatiles], SRC_BULK)
        if found:
            for key in found:
                self._requested.pop(key, None)
            self._store.delete_many(found)
            self._lengths[SRC_BULK] -= len(found)
        return [unpack(key) for key in found]

    def pop(self, source: Source) -> Metatile | None:
        """Take the first metatile of a queue and mark it in flight."""
        src = _NAMED_SRC[source] if isinstance(source, str) else source
        if self._lengths[src] <= 0:
            return None
        key = self._store.first(src)
        if key is None:
            return None
        self._lengths[src] -= 1
        self._rendering[key] = (src, False)
        self._store.set_state(key, RENDERING)
        return unpack(key)

    def claim(self, metatile: Metatile) -> None:
        """Mark a metatile in flight without popping it (a renderer re-registered while rendering it)."""
        key = pack(metatile)
        if key in self._rendering:
            return
        row = self._store.row(key)
        if row is None:
            self._rendering[key] = (metatile.z, False)
            self._store.put(key, metatile.z, next(self._back), RENDERING)
            return
        self._lengths[row[0]] -= 1
        self._rendering[key] = (row[0], False)
        self._store.set_state(key, RENDERING)

    def finish(self, metatile: Metatile) -> bool:
        """A render ended; returns True if the metatile was queued again because it expired meanwhile."""
        key = pack(metatile)
        flying = self._rendering.pop(key, None)
        if flying is None:  # not in flight: not ours to finish (a queued one stays queued)
            return False
        self._requested.pop(key, None)  # rendered: its requests are answered
        if flying[1]:
            self._lengths[metatile.z] += 1
            self._store.put(key, metatile.z, next(self._back), QUEUED)
            return True
        self._store.delete(key)
        return False

    def put_back(self, metatile: Metatile) -> None:
        """Return an in-flight metatile to the front of its queue (its renderer died or gave it up)."""
        key = pack(metatile)
        flying = self._rendering.pop(key, None)
        if flying is None:
            return
        self._lengths[flying[0]] += 1
        self._store.put(key, flying[0], next(self._front), QUEUED)
