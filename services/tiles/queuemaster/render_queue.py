"""The render queue: missing, important and per-zoom background queues of metatiles.

Each metatile is queued at most once (duplicates merge). Its class decides the queue: ``missing``
(requested, never rendered), ``important`` (requested while stale, or raised), ``background`` (expired;
one queue per zoom). Within a queue, metatiles go first in, first out; a metatile put back after its
renderer died goes to the front.

Each queue is a binary heap of ``(seq, metatile)`` with lazy deletion: raising a metatile's class pushes a
new heap item and leaves the old one stale; pops skip items whose seq no longer matches the metatile's
current entry. That keeps add, raise and pop at O(log n) amortised. Live counts per queue are kept
separately since heaps hold stale items.

Metatiles handed to a renderer stay known as *in flight* (persisted too) until ``finish`` or ``put_back``.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Literal

from ..strategy import IMPORTANT, MISSING
from ..tilemath import Metatile
from .queue_store import QueueStore, StoredMetatile

QueueClass = Literal["missing", "important", "background"]
CLASS_RANK: dict[str, int] = {"missing": 0, "important": 1, "background": 2}
Source = str | int  # MISSING, IMPORTANT, or a zoom (background queue)
AddOutcome = Literal["queued", "raised", "merged", "rendering", "marked_dirty"]


@dataclass(slots=True)
class _Entry:
    cls: str
    seq: int
    rendering: bool = False
    dirty: bool = False


def _source_of(cls: str, metatile: Metatile) -> Source:
    return metatile.z if cls == "background" else cls


class RenderQueue:
    """Queued and in-flight metatiles, persisted through a QueueStore."""

    def __init__(self, store: QueueStore) -> None:
        self._store = store
        self._entries: dict[Metatile, _Entry] = {}
        self._heaps: dict[Source, list[tuple[int, Metatile]]] = {}
        self._lengths: Counter[Source] = Counter()
        self._back = itertools.count(1)  # seq for appending
        self._front = itertools.count(-1, -1)  # seq for putting back at the front
        self._load()

    def _load(self) -> None:
        stored = self._store.load()
        if stored:
            self._back = itertools.count(max(s.seq for s in stored) + 1)
            self._front = itertools.count(min(min(s.seq for s in stored) - 1, -1), -1)
        restored: list[StoredMetatile] = []
        for item in stored:
            if item.rendering or item.dirty:
                # Its renderer may still be working on it; if it re-registers with this metatile it is
                # claimed back, otherwise it renders again from the front of its queue.
                item.seq, item.rendering, item.dirty = next(self._front), False, False
                restored.append(item)
            self._push(item.metatile, _Entry(item.cls, item.seq))
        with self._store.batch():
            self._store.save(restored)

    # -- internals ------------------------------------------------------------------------------------

    def _push(self, metatile: Metatile, entry: _Entry) -> None:
        self._entries[metatile] = entry
        source = _source_of(entry.cls, metatile)
        heapq.heappush(self._heaps.setdefault(source, []), (entry.seq, metatile))
        self._lengths[source] += 1

    def _persist(self, metatile: Metatile, entry: _Entry) -> None:
        self._store.save([StoredMetatile(metatile, entry.cls, entry.seq, entry.rendering, entry.dirty)])

    # -- queries --------------------------------------------------------------------------------------

    def batch(self):  # type: ignore[no-untyped-def]
        """One persistence transaction for several mutations (e.g. one expiry message)."""
        return self._store.batch()

    def state_of(self, metatile: Metatile) -> str | None:
        """``rendering``, the queued class, or None if the metatile is not known."""
        entry = self._entries.get(metatile)
        if entry is None:
            return None
        return "rendering" if entry.rendering else entry.cls

    @property
    def missing(self) -> int:
        return self._lengths[MISSING]

    @property
    def important(self) -> int:
        return self._lengths[IMPORTANT]

    def background_by_zoom(self) -> dict[int, int]:
        return {s: n for s, n in self._lengths.items() if isinstance(s, int) and n > 0}

    def queued_count(self) -> int:
        return sum(self._lengths.values())

    def in_flight(self) -> list[Metatile]:
        return [m for m, e in self._entries.items() if e.rendering]

    # -- mutations ------------------------------------------------------------------------------------

    def add(self, metatile: Metatile, cls: QueueClass) -> AddOutcome:
        """Queue a metatile, merging with what is already queued or rendering."""
        entry = self._entries.get(metatile)
        if entry is not None and entry.rendering:
            if cls == "background" and not entry.dirty:
                # Expired while rendering: the render in progress may predate the change.
                entry.dirty = True
                self._persist(metatile, entry)
                return "marked_dirty"
            return "rendering"
        if entry is not None:
            if CLASS_RANK[cls] >= CLASS_RANK[entry.cls]:
                return "merged"
            self._lengths[_source_of(entry.cls, metatile)] -= 1  # its old heap item is now stale
            new_entry = _Entry(cls, next(self._back))
            self._push(metatile, new_entry)
            self._persist(metatile, new_entry)
            return "raised"
        new_entry = _Entry(cls, next(self._back))
        self._push(metatile, new_entry)
        self._persist(metatile, new_entry)
        return "queued"

    def pop(self, source: Source) -> Metatile | None:
        """Take the first metatile of a queue and mark it in flight."""
        heap = self._heaps.get(source)
        while heap:
            seq, metatile = heapq.heappop(heap)
            entry = self._entries.get(metatile)
            if entry is None or entry.rendering or entry.seq != seq:
                continue  # stale heap item
            self._lengths[source] -= 1
            entry.rendering = True
            self._persist(metatile, entry)
            return metatile
        return None

    def claim(self, metatile: Metatile) -> None:
        """Mark a metatile in flight without popping it (a renderer re-registered while rendering it)."""
        entry = self._entries.get(metatile)
        if entry is None:
            entry = _Entry("background", next(self._back), rendering=True)
            self._entries[metatile] = entry
        elif not entry.rendering:
            self._lengths[_source_of(entry.cls, metatile)] -= 1
            entry.rendering = True
        self._persist(metatile, entry)

    def finish(self, metatile: Metatile) -> bool:
        """A render ended; returns True if the metatile was queued again because it expired meanwhile."""
        entry = self._entries.pop(metatile, None)
        if entry is None or not entry.rendering:
            if entry is not None:  # not ours to finish: keep it queued
                self._entries[metatile] = entry
            return False
        if entry.dirty:
            again = _Entry("background", next(self._back))
            self._push(metatile, again)
            self._persist(metatile, again)
            return True
        self._store.delete(metatile)
        return False

    def put_back(self, metatile: Metatile) -> None:
        """Return an in-flight metatile to the front of its queue (its renderer died or gave it up)."""
        entry = self._entries.get(metatile)
        if entry is None or not entry.rendering:
            return
        del self._entries[metatile]
        again = _Entry(entry.cls, next(self._front))
        self._push(metatile, again)
        self._persist(metatile, again)
