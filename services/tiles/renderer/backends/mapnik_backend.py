"""Mapnik backend: renders the metatile as one 2048x2048 image (fewer at z0-2) and slices it.

Rendering the metatile at once, with a buffer around it, is what keeps labels and line joins continuous
across tile edges. The style and data come from ``services/tiles/data`` (a generated fictional town), or
from ``TOPOSM_MAPNIK_STYLE`` to use another style file. With a store (``TOPOSM_STORE``: a directory made by
``toposm-import``, or a PostGIS DSN filled by ``toposm-import --postgis``) it renders real OSM data with the
TopOSM style of ``services.osmstore.style``.
"""

from __future__ import annotations

import os
from pathlib import Path

from services.toposm.tilemath import Metatile, Tile

from . import TILE_SIZE

DATA_DIR = Path(__file__).resolve().parents[2] / "data"  # services/tiles/data
DEFAULT_STYLE = DATA_DIR / "style.xml"
MERCATOR = "epsg:3857"
HALF_WORLD = 20037508.342789244  # Web Mercator x/y extent


def metatile_bbox(metatile: Metatile) -> tuple[float, float, float, float]:
    """The metatile's Web Mercator bounds (minx, miny, maxx, maxy)."""
    tiles_per_side = 1 << metatile.z
    span = 2 * HALF_WORLD / tiles_per_side
    x0, y0 = metatile.top_left.x, metatile.top_left.y
    minx = -HALF_WORLD + x0 * span
    maxy = HALF_WORLD - y0 * span
    return minx, maxy - metatile.side * span, minx + metatile.side * span, maxy


class MapnikBackend:
    def __init__(self, style: str | Path | None = None, store: str | Path | None = None) -> None:
        import mapnik  # imported here: only render workers using this backend need it

        self._mapnik = mapnik
        self._store = store or os.environ.get("TOPOSM_STORE") or None
        self._style = Path(style or os.environ.get("TOPOSM_MAPNIK_STYLE") or DEFAULT_STYLE)
        self._maps: dict[int, object] = {}  # one Map per metatile side (8, or 1/2/4 at z0-2)

    def _map(self, side: int):  # type: ignore[no-untyped-def]
        m = self._maps.get(side)
        if m is None:
            mapnik = self._mapnik
            m = mapnik.Map(side * TILE_SIZE, side * TILE_SIZE)
            if self._store:
                from services.osmstore.style import map_xml

                mapnik.load_map_from_string(m, map_xml(self._store))
            else:
                # base_path makes the style's relative data paths resolve beside the style file.
                mapnik.load_map(m, str(self._style), False, str(self._style.parent))
            m.srs = MERCATOR
            m.buffer_size = 128
            self._maps[side] = m
        return m

    def render(self, metatile: Metatile) -> dict[Tile, bytes]:
        mapnik = self._mapnik
        side = metatile.side
        m = self._map(side)
        m.zoom_to_box(mapnik.Box2d(*metatile_bbox(metatile)))
        image = mapnik.Image(side * TILE_SIZE, side * TILE_SIZE)
        mapnik.render(m, image)
        x0, y0 = metatile.top_left.x, metatile.top_left.y
        out: dict[Tile, bytes] = {}
        for tile in metatile.tiles():
            view = image.view((tile.x - x0) * TILE_SIZE, (tile.y - y0) * TILE_SIZE, TILE_SIZE, TILE_SIZE)
            out[tile] = view.to_string("png8")
        return out
