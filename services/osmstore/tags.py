"""Which OSM tags become which rendering-store feature: the one mapping import and diff updates share.

Each function takes a tag mapping and returns ``(table, attributes)`` pairs (usually none or one). Values are
normalised into a small vocabulary (``class``/``kind``) so the style's filters stay short and the PostGIS
option can alias osm2pgsql's columns to the same names.
"""

from __future__ import annotations

from collections.abc import Mapping

Attrs = dict[str, object]
Feature = tuple[str, Attrs]

ROAD_CLASS = {
    "motorway": "motorway",
    "motorway_link": "motorway",
    "trunk": "trunk",
    "trunk_link": "trunk",
    "primary": "primary",
    "primary_link": "primary",
    "secondary": "secondary",
    "secondary_link": "secondary",
    "tertiary": "tertiary",
    "tertiary_link": "tertiary",
    "residential": "minor",
    "unclassified": "minor",
    "living_street": "minor",
    "road": "minor",
    "service": "service",
    "pedestrian": "pedestrian",
    "track": "track",
    "footway": "path",
    "path": "path",
    "cycleway": "path",
    "bridleway": "path",
    "steps": "path",
    "trail": "path",
    "corridor": "path",
}
# Draw order inside one layer: minor roads first, so junctions show the bigger road on top.
ROAD_Z = {
    "path": 1,
    "track": 2,
    "service": 3,
    "pedestrian": 4,
    "minor": 5,
    "tertiary": 6,
    "secondary": 7,
    "primary": 8,
    "trunk": 9,
    "motorway": 10,
}
RAILWAY_KINDS = {"rail", "tram", "subway", "light_rail", "narrow_gauge", "funicular", "monorail", "preserved"}
WATERWAY_KINDS = {"river", "stream", "canal", "drain", "ditch"}

# Area tags -> landuse kind (the style colours kinds, not raw tag values).
LANDUSE_KIND = {
    ("landuse", "forest"): "forest",
    ("natural", "wood"): "forest",
    ("landuse", "grass"): "grass",
    ("landuse", "meadow"): "grass",
    ("landuse", "village_green"): "grass",
    ("landuse", "recreation_ground"): "grass",
    ("natural", "grassland"): "grass",
    ("natural", "scrub"): "scrub",
    ("natural", "heath"): "heath",
    ("natural", "wetland"): "wetland",
    ("natural", "beach"): "beach",
    ("natural", "sand"): "beach",
    ("natural", "bare_rock"): "rock",
    ("leisure", "park"): "park",
    ("leisure", "garden"): "park",
    ("leisure", "common"): "park",
    ("leisure", "nature_reserve"): "park",
    ("leisure", "golf_course"): "park",
    ("leisure", "pitch"): "pitch",
    ("leisure", "playground"): "pitch",
    ("leisure", "sports_centre"): "pitch",
    ("leisure", "stadium"): "pitch",
    ("leisure", "track"): "pitch",
    ("landuse", "residential"): "residential",
    ("landuse", "commercial"): "commercial",
    ("landuse", "retail"): "commercial",
    ("landuse", "civil"): "civic",
    ("amenity", "townhall"): "civic",
    ("landuse", "industrial"): "industrial",
    ("landuse", "railway"): "industrial",
    ("landuse", "port"): "industrial",
    ("landuse", "construction"): "construction",
    ("landuse", "brownfield"): "construction",
    ("landuse", "cemetery"): "cemetery",
    ("amenity", "grave_yard"): "cemetery",
    ("landuse", "military"): "military",
    ("landuse", "farmland"): "farmland",
    ("landuse", "orchard"): "farmland",
    ("landuse", "allotments"): "farmland",
    ("amenity", "school"): "education",
    ("amenity", "university"): "education",
    ("amenity", "college"): "education",
    ("amenity", "kindergarten"): "education",
    ("amenity", "hospital"): "hospital",
    ("amenity", "parking"): "parking",
}
WATER_TAGS = {
    ("natural", "water"),
    ("waterway", "riverbank"),
    ("landuse", "reservoir"),
    ("landuse", "basin"),
    ("landuse", "pond"),
    ("natural", "bay"),
    ("leisure", "swimming_pool"),
}
# The keys whose tags can make an area feature (what the import's key filter lets through), and every key
# ``area_features`` reads.
AREA_KEYS = sorted({"building"} | {k for k, _ in LANDUSE_KIND} | {k for k, _ in WATER_TAGS})
AREA_FEATURE_KEYS = (*AREA_KEYS, "name", "addr:housenumber", "water")
PLACE_RANK = {
    "city": 1,
    "town": 2,
    "suburb": 3,
    "village": 4,
    "quarter": 5,
    "neighbourhood": 6,
    "island": 6,
    "hamlet": 7,
    "square": 8,
    "locality": 8,
    "islet": 8,
}


def _flag(tags: Mapping[str, str], key: str) -> int:
    return 0 if tags.get(key, "no") in ("no", "false", "0") else 1


def _layer(tags: Mapping[str, str]) -> int:
    try:
        return max(-5, min(5, int(tags.get("layer", "0"))))
    except ValueError:
        return 0


def node_features(tags: Mapping[str, str]) -> list[Feature]:
    place = tags.get("place")
    name = tags.get("name")
    if place in PLACE_RANK and name:
        try:
            population = int(tags.get("population", "0"))
        except ValueError:
            population = 0
        return [("places", {"kind": place, "name": name, "rank": PLACE_RANK[place], "population": population})]
    return []


def line_features(tags: Mapping[str, str]) -> list[Feature]:
    """Features drawn along a way (roads, railways, waterways, coastline)."""
    out: list[Feature] = []
    highway = tags.get("highway")
    if highway in ROAD_CLASS and tags.get("area") != "yes":
        cls = ROAD_CLASS[highway]
        out.append(
            (
                "roads",
                {
                    "kind": highway,
                    "class": cls,
                    "name": tags.get("name"),
                    "ref": tags.get("ref"),
                    "bridge": _flag(tags, "bridge"),
                    "tunnel": _flag(tags, "tunnel"),
                    "layer": _layer(tags),
                    "z_order": _layer(tags) * 100 + ROAD_Z[cls] * 10 + (0 if highway.endswith("_link") else 1),
                },
            )
        )
    railway = tags.get("railway")
    if railway in RAILWAY_KINDS:
        out.append(
            (
                "railways",
                {
                    "kind": railway,
                    "name": tags.get("name"),
                    "bridge": _flag(tags, "bridge"),
                    "tunnel": _flag(tags, "tunnel") or int(railway == "subway"),
                    "layer": _layer(tags),
                },
            )
        )
    waterway = tags.get("waterway")
    if waterway in WATERWAY_KINDS:
        out.append(("waterways", {"kind": waterway, "name": tags.get("name"), "tunnel": _flag(tags, "tunnel")}))
    if tags.get("natural") == "coastline":
        out.append(("coastline", {"kind": "coastline"}))
    return out


def area_features(tags: Mapping[str, str]) -> list[Feature]:
    """Features filled inside an area (a closed way or an assembled multipolygon)."""
    out: list[Feature] = []
    name = tags.get("name")
    building = tags.get("building")
    if building and building != "no":
        out.append(("buildings", {"kind": building, "name": name, "housenumber": tags.get("addr:housenumber")}))
    pairs = list(tags.items())
    if any(p in WATER_TAGS for p in pairs):
        out.append(("water", {"kind": tags.get("water") or tags.get("natural") or "water", "name": name}))
        return out
    for pair in pairs:
        kind = LANDUSE_KIND.get(pair)
        if kind is not None:
            out.append(("landuse", {"kind": kind, "name": name}))
            break
    return out


def relation_makes_area(tags: Mapping[str, str]) -> bool:
    """Whether a relation with ``tags`` can make an area feature: an assembled area carries the relation's
    tags but ``type``, so either way. Only such relations' members matter to the rendering store."""
    return bool(area_features(tags) or area_features({k: v for k, v in tags.items() if k != "type"}))
