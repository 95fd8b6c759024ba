"""Turn pyosmium objects (with node locations) into rendering-store features.

Used by the import pass and by diff updates (which re-run it over a small file holding the objects to
rebuild), so a feature looks the same whichever way it got into the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import osmium

from . import tags as osm_tags
from .render_db import FeatureWriter
from .wkb import Coord, bbox_of, linestring, mercator, mercator_points, multipolygon, point, polygons_area


def _tags(tags: osmium.osm.TagList) -> dict[str, str]:
    return {t.k: t.v for t in tags}


def line_coords(locations: Iterable[tuple[float, float] | None]) -> list[Coord]:
    """A way's line in Web Mercator from its nodes' locations (lon, lat) in order: a node without one (outside
    a clipped extract) left out, a node repeating the previous one dropped."""
    coords: list[Coord] = []
    for c in mercator_points([loc for loc in locations if loc is not None]):
        if not coords or coords[-1] != c:
            coords.append(c)
    return coords


def _locations(way: osmium.osm.Way) -> Iterator[tuple[float, float] | None]:
    for ref in way.nodes:
        loc = ref.location
        yield (loc.lon, loc.lat) if loc.valid() else None


def _ring_coords(ring: osmium.osm.OuterRing | osmium.osm.InnerRing) -> list[Coord]:
    return mercator_points([(n.lon, n.lat) for n in ring])


class FeatureExtractor:
    """node/way/area callbacks writing features; ``wanted(osm_type, osm_id)`` limits which objects count."""

    def __init__(self, writer: FeatureWriter, wanted: Callable[[str, int], bool] | None = None) -> None:
        self.writer = writer
        self.wanted = wanted
        self.invalid_areas = 0

    def node(self, n: osmium.osm.Node) -> None:
        if not n.tags or (self.wanted and not self.wanted("n", n.id)):
            return
        features = osm_tags.node_features(_tags(n.tags))
        if features and n.location.valid():
            c = mercator(n.location.lon, n.location.lat)
            for table, attrs in features:
                self.writer.add(table, "n", n.id, attrs, point(c), (c[0], c[1], c[0], c[1]))

    def way(self, w: osmium.osm.Way) -> None:
        if not w.tags or (self.wanted and not self.wanted("w", w.id)):
            return
        features = osm_tags.line_features(_tags(w.tags))
        if features:
            self.line(w.id, features, line_coords(_locations(w)))

    def line(self, way_id: int, features: list[osm_tags.Feature], coords: list[Coord]) -> None:
        """Write a way's line ``features`` (``tags.line_features``) along ``coords`` (``line_coords``)."""
        if len(coords) < 2:
            return
        geom, bbox = linestring(coords), bbox_of(coords)
        for table, attrs in features:
            self.writer.add(table, "w", way_id, attrs, geom, bbox)

    def area(self, a: osmium.osm.Area) -> None:
        osm_type = "w" if a.from_way() else "r"
        osm_id = a.orig_id()
        if not a.tags or (self.wanted and not self.wanted(osm_type, osm_id)):
            return
        features = osm_tags.area_features(_tags(a.tags))
        if not features:
            return
        polygons = []
        for outer in a.outer_rings():
            rings = [_ring_coords(outer)] + [_ring_coords(inner) for inner in a.inner_rings(outer)]
            if len(rings[0]) >= 4:
                polygons.append(rings)
        if not polygons:
            self.invalid_areas += 1
            return
        geom = multipolygon(polygons)
        bbox = bbox_of([c for rings in polygons for c in rings[0]])
        area = polygons_area(polygons)
        for table, attrs in features:
            if table in ("water", "landuse", "buildings"):
                attrs = {**attrs, "area": area}
            self.writer.add(table, osm_type, osm_id, attrs, geom, bbox)
