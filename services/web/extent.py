"""Where the tile store's data is, for the map to open there (``GET /api/extent``).

The deepest zoom that has tiles says best where the map has been drawn (a render writes a whole metatile, and
the demo's and an operator's renders go deepest where the data is). Its tiles' bounding box is answered as
latitude/longitude bounds for Leaflet's ``fitBounds``. The scan is capped: on a large store the deepest zooms
hold millions of tiles, so a zoom with more than ``MAX_SCANNED`` entries gives way to the one above it
(a quarter as many tiles). A ``.meta`` store (``--tile-store meta``) is read the same way, one file per
metatile in mod_tile's hashed directories.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.toposm.contract import METATILE_SIZE
from services.toposm.metatile_file import xy_of_relpath
from services.toposm.tile_store import TileStore

MAX_SCANNED = 20_000
HASH_LEVELS = 5  # z/h4/h3/h2/h1/h0.meta


def _numbers(path: Path, suffix: str = "") -> list[int]:
    """The names in ``path`` that are a number (plus ``suffix``), as numbers; [] when ``path`` is not a dir."""
    try:
        names = [entry.name for entry in os.scandir(path)]
    except OSError:
        return []
    out = []
    for name in names:
        stem = name[: -len(suffix)] if suffix and name.endswith(suffix) else (None if suffix else name)
        if stem is not None and stem.isdigit():
            out.append(int(stem))
    return out


def _latitude(y: float, zoom: int) -> float:
    return math.degrees(math.atan(math.sinh(math.pi * (1 - 2 * y / (1 << zoom)))))


def _longitude(x: float, zoom: int) -> float:
    return x / (1 << zoom) * 360.0 - 180.0


def _zoom_box(root: Path, zoom: int) -> tuple[int, int, int, int] | None:
    """(min x, min y, max x, max y) of the tiles at ``zoom``; None when none, or too many to scan."""
    xs = _numbers(root / str(zoom))
    if len(xs) > MAX_SCANNED:
        return None
    scanned, ys_min, ys_max, xs_with = len(xs), [], [], []
    for x in xs:
        ys = _numbers(root / str(zoom) / str(x), ".png")
        scanned += len(ys)
        if scanned > MAX_SCANNED:
            return None
        if ys:
            xs_with.append(x)
            ys_min.append(min(ys))
            ys_max.append(max(ys))
    if not xs_with:
        return None
    return min(xs_with), min(ys_min), max(xs_with), max(ys_max)


def _meta_zoom_box(root: Path, zoom: int) -> tuple[int, int, int, int] | None:
    """``_zoom_box`` of a ``.meta`` store: the tiles of the metatiles whose files are there."""
    corners: list[tuple[int, int]] = []
    scanned = 0
    pending: list[tuple[Path, tuple[str, ...]]] = [(root / str(zoom), ())]
    while pending:
        directory, parts = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        scanned += len(entries)
        if scanned > MAX_SCANNED:
            return None
        for entry in entries:
            if len(parts) < HASH_LEVELS - 1:
                if entry.name.isdigit():
                    pending.append((Path(entry.path), (*parts, entry.name)))
            else:
                xy = xy_of_relpath((*parts, entry.name))
                if xy is not None:
                    corners.append(xy)
    if not corners:
        return None
    last = (1 << zoom) - 1
    return (
        min(x for x, _ in corners),
        min(y for _, y in corners),
        min(last, max(x for x, _ in corners) + METATILE_SIZE - 1),
        min(last, max(y for _, y in corners) + METATILE_SIZE - 1),
    )


def tile_root_extent(store: TileStore) -> dict[str, Any]:
    """``{"zoom": z, "bounds": [[south, west], [north, east]]}`` of the tiles at the deepest zoom that has any
    (and is small enough to scan); ``{"zoom": None, "bounds": None}`` for an empty store."""
    root = store.root
    zoom_box = _meta_zoom_box if store.kind == "meta" else _zoom_box
    for zoom in sorted(_numbers(root), reverse=True):
        box = zoom_box(root, zoom) if zoom <= 30 else None
        if box is not None:
            x0, y0, x1, y1 = box
            return {
                "zoom": zoom,
                "bounds": [
                    [_latitude(y1 + 1, zoom), _longitude(x0, zoom)],
                    [_latitude(y0, zoom), _longitude(x1 + 1, zoom)],
                ],
            }
    return {"zoom": None, "bounds": None}


class SharedScan:
    """One scan of the tile root at a time, whatever the number of requests: the ones that arrive while a scan
    runs share its answer. Each scan may read ~600,000 directory entries (``MAX_SCANNED`` a zoom), on the
    thread pool that also reads tiles: a flood of anonymous ``GET /api/extent`` would otherwise take every
    thread of it. A request after the scan ended scans again, so the answer follows the tiles written."""

    def __init__(self, scan: Callable[[], dict[str, Any]]) -> None:
        self._scan = scan
        self._running: asyncio.Future[dict[str, Any]] | None = None

    async def get(self) -> dict[str, Any]:
        running = self._running
        if running is None or running.done():
            running = self._running = asyncio.ensure_future(asyncio.to_thread(self._scan))
        # shield: a client that goes away does not cancel the scan the others wait for
        return await asyncio.shield(running)
