"""The tile store: one PNG per tile at ``<root>/z/x/y.png`` (the default), or mod_tile's ``.meta`` files.

Either way a metatile's files are written to a temporary file in their final directory and renamed over the
old ones with ``os.replace``, so a tile server never reads a half-written file and a killed renderer leaves
no partial tile behind (only, at worst, a stray ``.tmp`` file).

``--tile-store meta`` (``MetaTileStore``) writes each metatile as one ``.meta`` file in mod_tile's layout
(``metatile_file``), so renderd's tools and Apache's mod_tile can serve the same tile root (a mod_tile
``tile_dir`` holds one directory per style: point the tile root at ``<tile_dir>/<style>``). The queuemaster,
the renderers and toposm-web must be given the same kind.
"""

from __future__ import annotations

import calendar
import contextlib
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from .metatile_file import MAX_META_ZOOM, MetaFileError, encode, meta_relpath, read_tile
from .tilemath import Metatile, Tile

TILE_MODE = 0o644
TileStoreKind = Literal["png", "meta"]
TILE_STORE_KINDS: tuple[TileStoreKind, ...] = ("png", "meta")
# mod_tile's expiry of a .meta file (store_file.c, file_metatile_expire): its mtime goes back 20 years, which
# every mod_tile and renderd reads as "older than the data"; one already before 2006 is left as it is.
MOD_TILE_EXPIRED_BEFORE = calendar.timegm((2006, 1, 1, 0, 0, 0))
MOD_TILE_SET_BACK_YEARS = 20


def _write_atomically(final: Path, data: bytes, prefix: str) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=final.parent)
    try:
        # mkstemp makes it 0600; a tile is public web content, and a front server (nginx, whose workers may
        # run as another account) must read it
        os.fchmod(fd, TILE_MODE)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class TileStore:
    """``<root>/z/x/y.png``."""

    kind: TileStoreKind = "png"

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, tile: Tile) -> Path:
        """The file holding the tile (its mtime is when the tile was rendered)."""
        return self.root / str(tile.z) / str(tile.x) / f"{tile.y}.png"

    def tile_exists(self, tile: Tile) -> bool:
        return self.path(tile).is_file()

    def metatile_exists(self, metatile: Metatile) -> bool:
        """True once the metatile has been rendered.

        A render writes all of a metatile's tiles together, so its top-left tile stands for it.
        """
        return self.tile_exists(metatile.top_left)

    def read(self, tile: Tile) -> bytes | None:
        """The tile's bytes; None when it is not stored."""
        try:
            return self.path(tile).read_bytes()
        except FileNotFoundError:
            return None

    def write(self, tiles: Mapping[Tile, bytes]) -> None:
        """Store the tiles of one render (one metatile's)."""
        for tile, data in tiles.items():
            _write_atomically(self.path(tile), data, f".{tile.y}.")

    def mark_expired(self, metatile: Metatile) -> None:
        """What else this kind of store does when a metatile expires (the expiry marker is written anyway,
        see freshness.py): nothing for PNG files."""


class MetaTileStore(TileStore):
    """mod_tile's ``<root>/z/h4/h3/h2/h1/h0.meta``, one file per metatile."""

    kind: TileStoreKind = "meta"

    def path(self, tile: Tile) -> Path:
        return self.root / meta_relpath(tile)

    def metatile_exists(self, metatile: Metatile) -> bool:
        return metatile.z <= MAX_META_ZOOM and super().metatile_exists(metatile)

    def read(self, tile: Tile) -> bytes | None:
        """None when the metatile is not stored (or the file is damaged: logged by the caller as missing)."""
        try:
            with self.path(tile).open("rb") as f:
                return read_tile(f, tile) or None
        except (FileNotFoundError, MetaFileError):
            return None

    def write(self, tiles: Mapping[Tile, bytes]) -> None:
        metatiles = {tile.metatile for tile in tiles}
        if any(m.z > MAX_META_ZOOM for m in metatiles):  # it would overwrite another metatile's file
            raise ValueError(f"a .meta store holds zooms up to {MAX_META_ZOOM} (mod_tile's paths)")
        for metatile in metatiles:
            mine = {tile: data for tile, data in tiles.items() if tile.metatile == metatile}
            _write_atomically(self.root / meta_relpath(metatile), encode(metatile, mine), ".meta.")

    def mark_expired(self, metatile: Metatile) -> None:
        path = self.root / meta_relpath(metatile)
        with contextlib.suppress(OSError):
            st = path.stat()
            if st.st_mtime >= MOD_TILE_EXPIRED_BEFORE:
                os.utime(path, (st.st_atime, _years_back(st.st_mtime, MOD_TILE_SET_BACK_YEARS)))


def _years_back(stamp: float, years: int) -> float:
    t = time.gmtime(stamp)
    day = min(t.tm_mday, 28) if t.tm_mon == 2 else t.tm_mday  # 29 February has no year 20 back
    return calendar.timegm((t.tm_year - years, t.tm_mon, day, t.tm_hour, t.tm_min, t.tm_sec)) + stamp % 1


def open_tile_store(root: str | Path, kind: str = "png") -> TileStore:
    if kind == "meta":
        return MetaTileStore(root)
    if kind == "png":
        return TileStore(root)
    raise ValueError(f"unknown tile store {kind!r}; expected one of {', '.join(TILE_STORE_KINDS)}")


def check_tile_store_zoom(kind: str, max_zoom: int) -> None:
    """Refuse (ValueError, a usage error) a ``.meta`` store past the zoom its paths can tell apart."""
    if kind == "meta" and max_zoom > MAX_META_ZOOM:
        raise ValueError(
            f"--tile-store meta holds zooms up to {MAX_META_ZOOM} (mod_tile's paths); --max-zoom is {max_zoom}"
        )
