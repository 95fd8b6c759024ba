"""The import's area features (buildings, landuse, water), a few thousand areas at a time.

The same features as ``FeatureExtractor.area`` (which diff updates use): the area's tags decide them
(``tags.area_features``), the geometry is the multipolygon libosmium assembled, in Web Mercator, with its
area. libosmium writes each area's WKB (in degrees) in C++, and the coordinates of a whole batch are
projected as numpy arrays and written back into the WKB, so Python's work is per area and ring, not per
node. During the import's C++ pass, which the thread calling the Python handlers paces, the batches are only
spilled to a scratch file (``spill``) and written after the pass (``write_spilled``), beside the geometry
store's process that the pass's end starts (docs/performance.md, "The import's pass without the areas' features").
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

import numpy as np
import osmium

from . import tags as osm_tags
from .render_db import FeatureWriter
from .tags import Feature
from .wkb import mercator_arrays

_HEADER = struct.Struct("<BII")  # byte order, type, count (polygons of a multipolygon, rings of a polygon)
_COUNT = struct.Struct("<I")
_SPILLED = struct.Struct("<QQ")  # a spilled batch: the length of its JSON list of areas, of its WKB
_MEASURED = ("water", "landuse", "buildings")  # the tables with an ``area`` column


@dataclass
class _Ring:
    area: int  # index of the area in the batch
    polygon: int  # index of the polygon (outer ring with its inner rings) in the batch
    outer: bool
    offset: int  # byte offset of the coordinates in the batch's WKB
    points: int


class _Tags(Protocol):
    def get(self, key: str, default: None = None) -> str | None: ...

    def __iter__(self) -> Iterator[osmium.osm.Tag]: ...


def area_tags(tags: _Tags) -> dict[str, str]:
    """The tags ``tags.area_features`` reads, looked up by key (a C++ call each) rather than by iterating the
    whole list (a C++ call and a Python object per tag: docs/performance.md, "The OSM stores' design"). Where
    two tags could each make the landuse feature, the first in the object's order wins, so then the tags
    are read in order."""
    get = tags.get
    found = {key: value for key in osm_tags.AREA_FEATURE_KEYS if (value := get(key)) is not None}
    if sum(1 for pair in found.items() if pair in osm_tags.LANDUSE_KIND) > 1:
        return {t.k: t.v for t in tags}
    return found


_Pending = list[tuple[str, int, list[Feature], bytes]]  # osm type, id, features, WKB in degrees


@dataclass
class AreaFeatures:
    """Collects areas (``add``) and writes their features (``flush``, also when ``batch`` areas are in), or
    with ``spill`` only writes the batches there, for ``write_spilled`` to write their features later."""

    writer: FeatureWriter
    batch: int = 5000
    spill: BinaryIO | None = None
    invalid_areas: int = 0
    _factory: osmium.geom.WKBFactory = field(default_factory=osmium.geom.WKBFactory)
    _pending: _Pending = field(default_factory=list)

    def add(self, a: osmium.osm.Area) -> None:
        features = osm_tags.area_features(area_tags(a.tags))
        if not features:
            return
        try:
            wkb = bytes.fromhex(self._factory.create_multipolygon(a))
        except RuntimeError:  # libosmium's geometry_error: no valid ring
            self.invalid_areas += 1
            return
        self._pending.append(("w" if a.from_way() else "r", a.orig_id(), features, wkb))
        if len(self._pending) >= self.batch:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        if self.spill is not None:
            # JSON for the areas (floats and text come back as they were), then their WKB as it is.
            head = json.dumps(
                [[osm_type, osm_id, features, len(wkb)] for osm_type, osm_id, features, wkb in self._pending]
            ).encode()
            wkb = b"".join(p[3] for p in self._pending)
            self.spill.write(_SPILLED.pack(len(head), len(wkb)) + head + wkb)
        else:
            self._write_batch(self._pending)
        self._pending.clear()

    def write_spilled(self, path: Path) -> None:
        """Write the features of the batches ``spill`` wrote to ``path``, in their order."""
        with path.open("rb") as spilled:
            while sizes := spilled.read(_SPILLED.size):
                head_size, wkb_size = _SPILLED.unpack(sizes)
                areas, wkb = json.loads(spilled.read(head_size)), spilled.read(wkb_size)
                ends = np.cumsum([area[3] for area in areas]).tolist()
                self._write_batch(
                    [
                        (osm_type, osm_id, features, wkb[end - size : end])  # features: [table, attrs]
                        for (osm_type, osm_id, features, size), end in zip(areas, ends, strict=True)
                    ]
                )

    def _write_batch(self, pending: _Pending) -> None:
        data = bytearray(b"".join(p[3] for p in pending))
        starts = np.cumsum([0] + [len(p[3]) for p in pending]).tolist()
        rings = [ring for i, start in enumerate(starts[:-1]) for ring in _rings(data, start, i)]
        lonlat = (
            np.concatenate([np.frombuffer(data, "<f8", 2 * r.points, r.offset) for r in rings])
            if rings
            else np.zeros(0)
        )
        x, y = mercator_arrays(lonlat[0::2], lonlat[1::2])
        xy = np.empty(len(lonlat))
        xy[0::2], xy[1::2] = x, y
        packed = xy.tobytes()
        ring_starts = np.cumsum([0] + [r.points for r in rings])
        for r, at in zip(rings, ring_starts[:-1].tolist(), strict=True):
            data[r.offset : r.offset + 16 * r.points] = packed[16 * at : 16 * (at + r.points)]
        # Shoelace per ring, summed term by term in ring order, as wkb.ring_area sums (the same float result).
        terms = (x[:-1] * y[1:] - x[1:] * y[:-1]).tolist()
        areas = [
            abs(sum(terms[at : at + r.points - 1])) / 2 if r.points > 1 else 0.0
            for r, at in zip(rings, ring_starts[:-1].tolist(), strict=True)
        ]
        self._write(pending, data, starts, rings, ring_starts, x, y, areas)

    def _write(
        self,
        pending: _Pending,
        data: bytearray,
        starts: list[int],
        rings: list[_Ring],
        ring_starts: np.ndarray,
        x: np.ndarray,
        y: np.ndarray,
        areas: list[float],
    ) -> None:
        boxes = _outer_boxes(rings, ring_starts, x, y)
        # The rings come area by area, and a polygon's rings one after the other (its outer ring first).
        ring_area = np.fromiter((r.area for r in rings), np.int64, len(rings))
        bounds = np.searchsorted(ring_area, np.arange(len(pending) + 1)).tolist()
        for i, (osm_type, osm_id, features, _) in enumerate(pending):
            box = boxes.get(i)
            if box is None:  # no outer ring
                self.invalid_areas += 1
                continue
            # Each polygon's outer ring's area less its inner rings', summed polygon by polygon in ring order
            # (the float that wkb.polygons_area gives).
            total, polygon, outer, inner = 0.0, -1, 0.0, 0.0
            for k in range(bounds[i], bounds[i + 1]):
                if rings[k].polygon != polygon:
                    if polygon != -1:
                        total += outer - inner
                    polygon, outer, inner = rings[k].polygon, areas[k], 0.0
                else:
                    inner += areas[k]
            total += outer - inner
            geom = bytes(data[starts[i] : starts[i + 1]])
            for table, attrs in features:
                if table in _MEASURED:
                    attrs = {**attrs, "area": total}
                self.writer.add(table, osm_type, osm_id, attrs, geom, box)


def _outer_boxes(
    rings: list[_Ring], ring_starts: np.ndarray, x: np.ndarray, y: np.ndarray
) -> dict[int, tuple[float, float, float, float]]:
    """The bounding box of each area with an outer ring (area index -> minx, miny, maxx, maxy): the union of
    its outer rings' boxes (rings have at least one point)."""
    outer = np.flatnonzero(np.fromiter((r.outer for r in rings), bool, len(rings)))
    if len(outer) == 0:
        return {}
    first = ring_starts[:-1]  # every ring's points, one after the other: a box per ring, then the outer ones
    ring_boxes = [
        np.minimum.reduceat(x, first)[outer],
        np.minimum.reduceat(y, first)[outer],
        np.maximum.reduceat(x, first)[outer],
        np.maximum.reduceat(y, first)[outer],
    ]
    area_of = np.fromiter((rings[k].area for k in outer.tolist()), np.int64, len(outer))
    group = np.flatnonzero(np.r_[True, area_of[1:] != area_of[:-1]])
    merged = [
        np.minimum.reduceat(ring_boxes[0], group),
        np.minimum.reduceat(ring_boxes[1], group),
        np.maximum.reduceat(ring_boxes[2], group),
        np.maximum.reduceat(ring_boxes[3], group),
    ]
    return dict(zip(area_of[group].tolist(), zip(*(m.tolist() for m in merged), strict=True), strict=True))


def _rings(data: bytearray, start: int, area: int) -> list[_Ring]:
    """The rings of the multipolygon WKB at ``start``: where their coordinates are."""
    _, _, polygons = _HEADER.unpack_from(data, start)
    pos = start + _HEADER.size
    out: list[_Ring] = []
    for p in range(polygons):
        _, _, count = _HEADER.unpack_from(data, pos)
        pos += _HEADER.size
        for r in range(count):
            (points,) = _COUNT.unpack_from(data, pos)
            if points:  # an empty ring adds nothing to the outline, box or area
                out.append(_Ring(area, (area << 20) | p, r == 0, pos + 4, points))
            pos += 4 + 16 * points
    return out
