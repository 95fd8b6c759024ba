"""The Spark tests' independent tile-math oracle (mercantile)."""

from __future__ import annotations

# --- independent tile-math oracle (mercantile) ------------------------------------------------
import math  # noqa: E402

import mercantile  # noqa: E402

_HALF = math.pi * 6378137.0  # half the web-mercator world width in metres


def oracle_point_tiles(lon: float, lat: float, zoom: int, buffer: float = 0.1) -> set[tuple[int, int, int]]:
    """Tiles within ``buffer`` tile of a point, from mercantile's metre projection (clamped, no wrap)."""
    mx, my = mercantile.xy(lon, max(min(lat, 85.0511287798066), -85.0511287798066))
    n = 2**zoom
    fx = (mx + _HALF) / (2 * _HALF) * n
    fy = (_HALF - my) / (2 * _HALF) * n
    xs = range(max(0, math.floor(fx - buffer)), min(n - 1, math.floor(fx + buffer)) + 1)
    ys = range(max(0, math.floor(fy - buffer)), min(n - 1, math.floor(fy + buffer)) + 1)
    tiles = {(zoom, x, y) for x in xs for y in ys}
    centre = mercantile.tile(lon, lat, zoom)
    assert (zoom, centre.x, centre.y) in tiles or not xs or not ys
    return tiles


def oracle_propagate(tiles: set[tuple[int, int, int]], min_zoom: int) -> set[tuple[int, int, int]]:
    out: set[tuple[int, int, int]] = set()
    for z, x, y in tiles:
        out.add((z, x, y))
        for zz in range(min_zoom, z):
            parent = mercantile.parent(mercantile.Tile(x, y, z), zoom=zz)
            out.add((zz, parent.x, parent.y))
    return out


def per_zoom(tiles: set[tuple[int, int, int]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for z, _, _ in tiles:
        counts[str(z)] = counts.get(str(z), 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: int(kv[0])))


def oracle_metatiles(tiles: set[tuple[int, int, int]]) -> set[str]:
    return {f"{z}/{(x // 8) * 8}/{(y // 8) * 8}" for z, x, y in tiles}
