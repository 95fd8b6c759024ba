"""Which tiles are dirty, kept on disk in the tile root so every tile server sees it and it outlives restarts.

renderd decides that a tile is old by comparing its mtime with the time of the last data import
(``planet-import-complete``); here the timestamp is per metatile: expiring a metatile touches a marker file
whose mtime is the time of the expiry, and a tile is

* ``missing`` when its file does not exist,
* ``dirty`` when its metatile's marker is newer than the tile (expired after the tile was rendered),
* ``fresh`` otherwise.

A render that writes the metatile's tiles after the expiry makes them fresh again without anyone touching
the marker; the first server that sees a marker older than its tile removes it (``state``), so a front that
only checks whether the marker exists (nginx, see services/web/front.py) serves the tile directly again.

The marker of metatile ``z/mx/my`` is ``<root>/.expired/z/<mx // 125>/<my // 125>/<mx % 125>-<my % 125>``.
The split in 125s is what makes it computable without arithmetic: a metatile is 8 tiles wide and
1000 = 8 x 125, so ``x // 1000`` is the tile number without its last three digits and ``mx % 125`` is those
three digits divided by 8; an nginx ``location`` regex and one ``map`` (``nginx_lookup_map``) find the
marker of ``/tiles/z/x/y.png`` from the URL alone.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .contract import METATILE_SIZE
from .tile_store import TileStore
from .tilemath import Metatile, Tile

MARKER_DIR = ".expired"
BLOCK = 1000 // METATILE_SIZE  # metatiles per 1000 tiles: 125

TileState = Literal["fresh", "dirty", "missing"]


@dataclass(frozen=True, slots=True)
class TileStatus:
    state: TileState
    path: Path
    mtime: float | None  # the tile file's mtime (None when missing)


class FreshnessStore:
    def __init__(self, tiles: TileStore) -> None:
        self.tiles = tiles
        self.root = tiles.root / MARKER_DIR

    def marker(self, metatile: Metatile) -> Path:
        return (
            self.root
            / str(metatile.z)
            / str(metatile.mx // BLOCK)
            / str(metatile.my // BLOCK)
            / f"{metatile.mx % BLOCK}-{metatile.my % BLOCK}"
        )

    def expire(self, metatiles: Iterable[Metatile], when: float | None = None) -> int:
        """Mark the metatiles expired at ``when`` (now); metatiles never rendered get no marker (they are
        missing, not dirty). Returns how many were marked. Blocking file work: call it off the event loop."""
        stamp = time.time() if when is None else when
        marked = 0
        for metatile in dict.fromkeys(metatiles):
            if not self.tiles.metatile_exists(metatile):
                continue
            path = self.marker(metatile)
            try:
                _touch(path, stamp)
            except FileNotFoundError:
                path.parent.mkdir(parents=True, exist_ok=True)
                _touch(path, stamp)
            self.tiles.mark_expired(metatile)  # a .meta store also tells mod_tile, its own way
            marked += 1
        return marked

    def expired_at(self, metatile: Metatile) -> float | None:
        try:
            return self.marker(metatile).stat().st_mtime
        except OSError:
            return None

    def state(self, tile: Tile) -> TileStatus:
        path = self.tiles.path(tile)
        try:
            mtime_ns = path.stat().st_mtime_ns
        except OSError:
            return TileStatus("missing", path, None)
        marker = self.marker(tile.metatile)
        try:
            expired_ns = marker.stat().st_mtime_ns
        except OSError:
            return TileStatus("fresh", path, mtime_ns / 1e9)
        if expired_ns > mtime_ns:
            return TileStatus("dirty", path, mtime_ns / 1e9)
        self._forget(marker, expired_ns)
        return TileStatus("fresh", path, mtime_ns / 1e9)

    @staticmethod
    def _forget(marker: Path, expired_ns: int) -> None:
        # Re-rendered since it expired. Unlink only the marker we compared: one written again since then
        # (a newer expiry) stays. The window between this stat and the unlink is microseconds, and a lost
        # marker costs at most a tile served as fresh that the queuemaster re-renders anyway.
        with contextlib.suppress(OSError):
            if marker.stat().st_mtime_ns == expired_ns:
                marker.unlink()


def _touch(path: Path, stamp: float) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.utime(fd, (stamp, stamp))
    finally:
        os.close(fd)


def nginx_lookup_map() -> list[tuple[str, int]]:
    """The last (up to) three digits of a tile number as nginx captures them, to ``// 8``: every string of
    one to three digits (``"7"``, ``"07"``, ``"007"`` are all 0). With ``x // 1000`` from the regex this is
    ``marker``'s path for the tile's metatile."""
    entries: list[tuple[str, int]] = []
    for width in (1, 2, 3):
        for n in range(10**width):
            entries.append((f"{n:0{width}d}", n // METATILE_SIZE))
    return entries
