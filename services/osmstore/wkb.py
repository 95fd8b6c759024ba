"""Web Mercator projection and the few WKB shapes the rendering store holds (point, line, multipolygon).

Hand-written because the store needs only these three little-endian encodings, and the same code serves the
import and the diff updates without pulling a geometry library into every render worker.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

EARTH_RADIUS = 6378137.0
MAX_LAT = 85.0511287798066  # Web Mercator's square world

Coord = tuple[float, float]
Ring = Sequence[Coord]
BBox = tuple[float, float, float, float]  # minx, miny, maxx, maxy

_WKB_POINT, _WKB_LINESTRING, _WKB_POLYGON, _WKB_MULTIPOLYGON = 1, 2, 3, 6


Floats = npt.NDArray[np.float64]


def mercator_arrays(lon: Floats, lat: Floats) -> tuple[Floats, Floats]:
    """EPSG:4326 degrees to EPSG:3857 metres, for whole arrays; NaN stays NaN.

    The stores' one projection: the import projects arrays, a diff's rebuild a way or a ring at a time, and
    both come here, so a feature comes out byte for byte the same either way. (numpy's log and tan differ
    from the math module's in the last bit for ~0.5% of values where numpy runs its AVX-512 code; its
    results do not depend on the length of the array.)"""
    lat = np.clip(lat, -MAX_LAT, MAX_LAT)
    return np.radians(lon) * EARTH_RADIUS, np.log(np.tan(math.pi / 4 + np.radians(lat) / 2)) * EARTH_RADIUS


def mercator_points(locations: Sequence[tuple[float, float]]) -> list[Coord]:
    """``mercator_arrays`` for a list of (lon, lat): one call per way or ring, not per node."""
    if not locations:
        return []
    lonlat = np.array(locations, dtype=np.float64)
    x, y = mercator_arrays(lonlat[:, 0], lonlat[:, 1])
    return list(zip(x.tolist(), y.tolist(), strict=True))


def mercator(lon: float, lat: float) -> Coord:
    """One point (``mercator_points``)."""
    return mercator_points([(lon, lat)])[0]


def bbox_of(coords: Sequence[Coord]) -> BBox:
    xs = [c[0] for c in coords]
    ys = [c[1] for c in coords]
    return min(xs), min(ys), max(xs), max(ys)


def wkb_bbox(geom: bytes) -> BBox:
    """The box of a geometry written here, as its writer gave it with the geometry (``bbox_of``): a point's,
    a line's points', a multipolygon's outer rings' (inner rings lie inside them). ValueError for anything
    else, a truncated blob included."""
    try:
        kind = struct.unpack_from("<I", geom, 1)[0]
        if kind == _WKB_POINT:
            x, y = struct.unpack_from("<dd", geom, 5)
            return x, y, x, y
        if kind == _WKB_LINESTRING:
            return _box(np.frombuffer(geom, "<f8", 2 * struct.unpack_from("<I", geom, 5)[0], 9))
        if kind != _WKB_MULTIPOLYGON:
            raise ValueError(f"not a geometry this store writes (WKB type {kind})")
        outers: list[npt.NDArray[np.float64]] = []
        offset = 9
        for _ in range(struct.unpack_from("<I", geom, 5)[0]):
            rings = struct.unpack_from("<I", geom, offset + 5)[0]
            offset += 9
            for ring in range(rings):
                points = struct.unpack_from("<I", geom, offset)[0]
                if ring == 0:
                    outers.append(np.frombuffer(geom, "<f8", 2 * points, offset + 4))
                offset += 4 + 16 * points
        return _box(np.concatenate(outers))
    except struct.error as exc:
        raise ValueError(f"truncated WKB ({exc})") from None


def _box(flat: npt.NDArray[np.float64]) -> BBox:
    xs, ys = flat[0::2], flat[1::2]
    return float(xs.min()), float(ys.min()), float(xs.max()), float(ys.max())


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
