"""Tirex-style bucket limits: how many render threads background work may take at once.

Tirex gives each priority bucket a ``maxproc``; a job of a full bucket waits even when a renderer is free, so
a free renderer is there when a viewer asks for a tile. Here the buckets are the queue classes: background
work (expired metatiles, and bulk pre-rendering with them) takes at most ``background`` render threads, bulk
pre-rendering alone at most ``bulk``; missing and important (on-demand) work is never limited. A thread whose
strategy finds only work of a full bucket stays idle for the next request. None: no limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from .render_queue import RenderQueue


@dataclass(frozen=True)
class BucketLimits:
    background: int | None = None  # expired and bulk together
    bulk: int | None = None

    def __post_init__(self) -> None:
        for name, limit in (("background", self.background), ("bulk", self.bulk)):
            if limit is not None and limit < 0:
                raise ValueError(f"the {name} thread limit must not be negative")

    def open_queues(self, queue: RenderQueue) -> tuple[dict[int, int], int]:
        """The background queue lengths by zoom and the bulk queue length a pick may take from now: a full
        bucket's queues read as empty."""
        by_zoom, bulk = queue.background_by_zoom(), queue.bulk
        if (self.background is None and self.bulk is None) or not (by_zoom or bulk):
            return by_zoom, bulk
        flying = queue.in_flight_by_class()
        if self.background is not None and flying["background"] + flying["bulk"] >= self.background:
            return {}, 0
        if self.bulk is not None and flying["bulk"] >= self.bulk:
            return by_zoom, 0
        return by_zoom, bulk

    def describe(self) -> dict[str, int | None]:
        return {"background": self.background, "bulk": self.bulk}
