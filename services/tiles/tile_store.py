"""The tile store: one PNG per tile at ``<root>/z/x/y.png``, written atomically.

Each tile is written to a temporary file in its final directory and renamed over the old one with
``os.replace``, so a tile server never reads a half-written PNG and a killed renderer leaves no partial
tile behind (only, at worst, a stray ``.tmp`` file).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from .tilemath import Metatile, Tile

TILE_MODE = 0o644


class TileStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, tile: Tile) -> Path:
        return self.root / str(tile.z) / str(tile.x) / f"{tile.y}.png"

    def tile_exists(self, tile: Tile) -> bool:
        return self.path(tile).is_file()

    def metatile_exists(self, metatile: Metatile) -> bool:
        """True once the metatile has been rendered.

        A render writes all of a metatile's tiles together, so its top-left tile stands for it.
        """
        return self.tile_exists(metatile.top_left)

    def write(self, tiles: Mapping[Tile, bytes]) -> None:
        for tile, data in tiles.items():
            final = self.path(tile)
            final.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{tile.y}.", suffix=".tmp", dir=final.parent)
            try:
                # mkstemp makes it 0600; a tile is public web content, and a front server (nginx, whose
                # workers may run as another account) must read it
                os.fchmod(fd, TILE_MODE)
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                os.replace(tmp, final)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
