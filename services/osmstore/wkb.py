"""Web Mercator projection and the few WKB shapes the rendering store holds (point, line, multipolygon).

Hand-written because the store needs only these three little-endian encodings, and the same code serves the
import and the diff updates without pulling a geometry library into every render worker.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

EARTH_RADIUS = 6378137.0
MAX_LAT = 85.0511287798066  # Web Mercator's square world

Coord = tuple[float, float]
Ring = Sequence[Coord]
BBox = tuple[float, float, float, float]  # minx, miny, maxx, maxy

_WKB_POINT, _WKB_LINESTRING, _WKB_POLYGON, _WKB_MULTIPOLYGON = 1, 2, 3, 6


def mercator(lon: float, lat: float) -> Coord:
    """EPSG:4326 degrees to EPSG:3857 metres."""
    lat = max(-MAX_LAT, min(MAX_LAT, lat))
    x = math.radians(lon) * EARTH_RADIUS
    y = math.log(math.tan(math.pi / 4 + math.radians(lat) / 2)) * EARTH_RADIUS
    return x, y


def bbox_of(coords: Sequence[Coord]) -> BBox:
    xs = [c[0] for c in coords]
    ys = [c[1] for c in coords]
    return min(xs), min(ys), max(xs), max(ys)


def point(c: Coord) -> bytes:
    return struct.pack("<BIdd", 1, _WKB_POINT, c[0], c[1])


def _points(coords: Sequence[Coord]) -> bytes:
    flat = [v for c in coords for v in c]
    return struct.pack(f"<I{len(flat)}d", len(coords), *flat)


def linestring(coords: Sequence[Coord]) -> bytes:
    return struct.pack("<BI", 1, _WKB_LINESTRING) + _points(coords)


def multipolygon(polygons: Sequence[Sequence[Ring]]) -> bytes:
    """Each polygon is its outer ring followed by its inner rings; rings are closed coordinate lists."""
    out = [struct.pack("<BII", 1, _WKB_MULTIPOLYGON, len(polygons))]
    for rings in polygons:
        out.append(struct.pack("<BII", 1, _WKB_POLYGON, len(rings)))
        out.extend(_points(ring) for ring in rings)
    return b"".join(out)


def ring_area(ring: Ring) -> float:
    """Unsigned shoelace area (square Mercator metres)."""
    s = 0.0
    for (x0, y0), (x1, y1) in zip(ring, ring[1:], strict=False):
        s += x0 * y1 - x1 * y0
    return abs(s) / 2


def polygons_area(polygons: Sequence[Sequence[Ring]]) -> float:
    return sum(ring_area(rings[0]) - sum(ring_area(r) for r in rings[1:]) for rings in polygons if rings)
