"""How the queuemaster takes an expiry list into its render queue: parsing ``z/x/y;...`` with the configured
zoom range, adding ancestors, and queueing the metatiles in one statement per message; lists of any size are
taken a chunk per turn of the event loop. ``Queuemaster`` (``state_machine``) inherits it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from services.toposm.error_messages import failed
from services.toposm.tile_store import TileStore
from services.toposm.tilemath import ZoomRange

from .expiry_keys import ancestor_keys, expiry_keys
from .render_queue import RenderQueue
from .settings import QueuemasterSettings
from .stats import QueuemasterStats

log = structlog.get_logger("toposm.queuemaster")
# Text of an expiry broadcast handled per turn of the event loop (and committed together): about 1000
# tiles, short enough a turn; one commit per 1000-tile message, not four (docs/performance.md, "The queuemaster").
EXPIRY_CHUNK_CHARS = 16 * 1024


class ExpiryIntake:
    """The expiry part of ``Queuemaster``: it uses the state machine's settings, queue, tile store and stats."""

    settings: QueuemasterSettings
    zooms: ZoomRange
    queue: RenderQueue
    tiles: TileStore
    stats: QueuemasterStats
    work_available: asyncio.Event

    def expire(self, text: str, *, strict: bool) -> dict[str, Any]:
        """Queue the metatiles of an expiry list ``z/x/y;...`` (with ancestors as configured).

        ``strict`` (the ``expire`` command) refuses a list with any invalid item; the alert path (nobody to
        answer) takes the valid items and logs the others.
        """
        keys, problems = expiry_keys(text, self.zooms)  # packed metatile keys: no object per tile
        if problems and strict:
            more = " ..." if len(problems) > 5 else ""
            raise failed("invalid_tile", "; ".join(problems[:5]) + more)
        if problems:
            self.stats.count("invalid_expiry_items", len(problems))
            log.warning("invalid expiry items ignored", count=len(problems), first=problems[0])
        # Spark sends each expired metatile as its top-left tile, so dedup by metatile before anything else.
        metatiles: dict[int, None] = dict.fromkeys(keys)
        propagate = self.settings.propagate_to_zoom
        if propagate is not None:
            ancestor_keys(metatiles, max(propagate, self.zooms.min_zoom))
        outcome: dict[str, int] = {
            "queued": 0,
            "merged": 0,
            "raised": 0,
            "rendering": 0,
            "marked_dirty": 0,
            "not_rendered_yet": 0,
        }
        # One lookup and one insert statement for the whole message (one transaction), not two per metatile.
        keep = None if self.settings.render_missing_expired else self.tiles.metatile_exists
        outcome.update(self.queue.add_expired_keys(metatiles, keep_unknown=keep))
        self.stats.count("expired", len(keys))
        if outcome["queued"]:
            self.work_available.set()
        return {"tiles": len(keys), "metatiles": len(metatiles), "invalid": len(problems), **outcome}

    async def expire_in_chunks(self, text: str) -> dict[str, Any]:
        """The broadcast path (``strict=False``) for lists of any size: about ``EXPIRY_CHUNK_CHARS`` of text
        at a time, yielding to the loop in between, so a 16 MiB list (a million tiles, seconds of work)
        never stops pings, replies or heartbeats for more than a few milliseconds. Counts are summed over
        the chunks (a metatile named in two chunks counts twice under ``metatiles``; it is queued once)."""
        totals: dict[str, int] = {}
        pos = 0
        while pos < len(text):
            end = text.find(";", pos + EXPIRY_CHUNK_CHARS)
            end = len(text) if end < 0 else end
            chunk = text[pos:end].strip("; \n")
            pos = end + 1
            if chunk:
                for key, value in self.expire(chunk, strict=False).items():
                    totals[key] = totals.get(key, 0) + value
            await asyncio.sleep(0)
        return totals
