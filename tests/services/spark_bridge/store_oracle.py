"""An independent oracle for expiry against a store: plain Python over the geometry pyosmium read.

Nothing here calls the code under test. Points expire every tile within 0.1 tile of them (osm2pgsql's
leeway, ``oracle_point_tiles``). For a line the expected set is bracketed: it *must* hold every tile the
line passes through (dense sampling, 0.005 tile steps, no buffer) and the buffered points of its vertices,
and it *may* hold only tiles within the 0.1-tile buffer of the line (dense sampling with the buffer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import mercantile
from spark_helpers import oracle_metatiles, oracle_point_tiles, oracle_propagate

_HALF = math.pi * 6378137.0
LonLat = tuple[float, float]
Tiles = set[tuple[int, int, int]]


def frac(lon: float, lat: float, zoom: int) -> tuple[float, float]:
    mx, my = mercantile.xy(lon, lat)
    n = 2**zoom
    return (mx + _HALF) / (2 * _HALF) * n, (_HALF - my) / (2 * _HALF) * n


def _line_tiles(a: LonLat, b: LonLat, zoom: int, buffer: float) -> Tiles:
    ax, ay = frac(*a, zoom)
    bx, by = frac(*b, zoom)
    steps = max(1, math.ceil(max(abs(bx - ax), abs(by - ay)) / 0.005))
    out: Tiles = set()
    for i in range(steps + 1):
        t = i / steps
        x, y = ax + (bx - ax) * t, ay + (by - ay) * t
        for tx in range(math.floor(x - buffer), math.floor(x + buffer) + 1):
            for ty in range(math.floor(y - buffer), math.floor(y + buffer) + 1):
                out.add((zoom, tx, ty))
    return out


@dataclass
class Expected:
    """What a change must expire and what it may expire, at max zoom."""

    must: Tiles = field(default_factory=set)
    may: Tiles = field(default_factory=set)

    def point(self, where: LonLat, zoom: int) -> None:
        tiles = oracle_point_tiles(*where, zoom)
        self.must |= tiles
        self.may |= tiles

    def line(self, coords: list[LonLat], zoom: int) -> None:
        for where in coords:
            self.point(where, zoom)
        for a, b in zip(coords, coords[1:], strict=False):
            self.must |= _line_tiles(a, b, zoom, 0.0)
            self.may |= _line_tiles(a, b, zoom, 0.1 + 1e-9)

    def metatiles(self, min_zoom: int) -> tuple[set[str], set[str]]:
        return (
            oracle_metatiles(oracle_propagate(self.must, min_zoom)),
            oracle_metatiles(oracle_propagate(self.may, min_zoom)),
        )
