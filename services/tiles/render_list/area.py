"""The metatiles of an area: a bounding box at a range of zooms, in a fixed order that is cheap to resume.

The order is zoom by zoom (lowest first, as render_list goes), then by ``mx``, then by ``my``. Any position in
it is computed, not enumerated, so a resumed run starts where the last one stopped at once, however large the
area (a whole country at z10-18 is hundreds of millions of tiles; the plan holds a few numbers per zoom).

A tile belongs to the area when it intersects the box; a tile that only touches its east or south edge does
not (the convention of mercantile's ``tiles()``, which the tests compare against).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from services.toposm.contract import METATILE_SHIFT
from services.toposm.tilemath import MAX_SUPPORTED_ZOOM, Metatile, ZoomRange

LAT_LIMIT = 85.051129  # Web Mercator's edge
EDGE = 1e-11  # degrees taken off the east and south edges: a tile that only touches them is out
ROUNDING = 1e-14  # a coordinate on a tile boundary computes to just below it; this puts it on it


class AreaError(ValueError):
    """A bounding box or zoom range that makes no sense; the message says which part."""


@dataclass(frozen=True, slots=True)
class BBox:
    west: float
    south: float
    east: float
    north: float

    @classmethod
    def parse(cls, text: str) -> BBox:
        parts = text.split(",")
        if len(parts) != 4:
            raise AreaError(f"bbox {text!r} must be W,S,E,N (four numbers, degrees)")
        try:
            west, south, east, north = (float(p) for p in parts)
        except ValueError:
            raise AreaError(f"bbox {text!r} must be W,S,E,N (four numbers, degrees)") from None
        if not all(math.isfinite(v) for v in (west, south, east, north)):
            raise AreaError(f"bbox {text!r}: the numbers must be finite")
        if not (-180 <= west < east <= 180):
            raise AreaError(
                f"bbox {text!r}: need -180 <= W < E <= 180 (for an area across the antimeridian, "
                "run one box on each side)"
            )
        if not (-90 <= south < north <= 90):
            raise AreaError(f"bbox {text!r}: need -90 <= S < N <= 90")
        return cls(west, south, east, north)

    def as_list(self) -> list[float]:
        return [self.west, self.south, self.east, self.north]


def parse_zooms(text: str) -> ZoomRange:
    """``10-16`` or ``12``."""
    low, sep, high = text.partition("-")
    try:
        zooms = (int(low), int(high) if sep else int(low))
    except ValueError:
        raise AreaError(f"zooms {text!r} must be Z or ZMIN-ZMAX, e.g. 10-16") from None
    if not 0 <= zooms[0] <= zooms[1] <= MAX_SUPPORTED_ZOOM:
        raise AreaError(f"zooms {text!r}: need 0 <= ZMIN <= ZMAX <= {MAX_SUPPORTED_ZOOM}")
    return ZoomRange(*zooms)


def tile_xy(lon: float, lat: float, zoom: int) -> tuple[int, int]:
    """The tile holding a point (Web Mercator; latitudes beyond its edge clamp to the edge)."""
    n = 1 << zoom
    x = lon / 360.0 + 0.5
    sin_lat = math.sin(math.radians(max(-LAT_LIMIT, min(LAT_LIMIT, lat))))
    y = 0.5 - 0.25 * math.log((1.0 + sin_lat) / (1.0 - sin_lat)) / math.pi
    return (min(n - 1, max(0, math.floor((x + ROUNDING) * n))), min(n - 1, max(0, math.floor((y + ROUNDING) * n))))


@dataclass(frozen=True, slots=True)
class ZoomBlock:
    """The metatiles of the area at one zoom: ``mx0..mx1`` x ``my0..my1``, from position ``start`` on."""

    zoom: int
    mx0: int
    my0: int
    columns: int
    rows: int
    start: int

    @property
    def count(self) -> int:
        return self.columns * self.rows

    def at(self, offset: int) -> Metatile:
        return Metatile(self.zoom, self.mx0 + offset // self.rows, self.my0 + offset % self.rows)


class AreaPlan:
    def __init__(self, bbox: BBox, zooms: ZoomRange) -> None:
        self.bbox = bbox
        self.zooms = zooms
        self.blocks: list[ZoomBlock] = []
        start = 0
        for zoom in range(zooms.min_zoom, zooms.max_zoom + 1):
            x0, y0 = tile_xy(bbox.west, bbox.north, zoom)
            x1, y1 = tile_xy(bbox.east - EDGE, bbox.south + EDGE, zoom)
            mx0, my0, mx1, my1 = (v >> METATILE_SHIFT for v in (x0, y0, x1, y1))
            block = ZoomBlock(zoom, mx0, my0, mx1 - mx0 + 1, my1 - my0 + 1, start)
            self.blocks.append(block)
            start += block.count
        self.count = start

    def at(self, position: int) -> Metatile:
        for block in self.blocks:
            if position < block.start + block.count:
                return block.at(position - block.start)
        raise IndexError(f"position {position} is past the plan's {self.count} metatiles")

    def metatiles(self, start: int = 0) -> Iterator[tuple[int, Metatile]]:
        """(position, metatile) from ``start`` on."""
        for block in self.blocks:
            end = block.start + block.count
            for position in range(max(start, block.start), end):
                yield position, block.at(position - block.start)

    def per_zoom(self) -> dict[int, int]:
        return {block.zoom: block.count for block in self.blocks}
