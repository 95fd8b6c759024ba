"""A real-looking edit of central Helsinki, published as an OSM replication diff.

The edit is made against the real extract (read with pyosmium): Mikonkatu is renamed, one corner of a
building beside it is moved, and a new building is drawn. It is written as ``000/000/001.osc.gz`` with its
state file and a top-level ``state.txt``, exactly as planet.openstreetmap.org publishes minutely diffs, for
``toposm-replicate`` to pick up.
"""

from __future__ import annotations

import gzip
import math
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import quoteattr

import osmium

from services.osmstore.replication import publish_diff

STREET = "Mikonkatu"
NEW_NAME = "Qbrokerinkatu"
NEW_BUILDING_ID = 9_990_000_100


@dataclass(frozen=True)
class DemoEdit:
    centre: tuple[float, float]  # where the edit is (lon, lat): the demo renders around it
    streets: list[int]
    moved_node: int
    new_building: int
    text: str  # the osmChange document


def _tags(tags: dict[str, str]) -> str:
    return "".join(f"<tag k={quoteattr(k)} v={quoteattr(v)}/>" for k, v in tags.items())


def _node(nid: int, lon: float, lat: float, version: int) -> str:
    return f'<node id="{nid}" version="{version}" lat="{lat:.7f}" lon="{lon:.7f}"/>'


def helsinki_edit(extract: Path) -> DemoEdit:
    nodes: dict[int, tuple[float, float]] = {}
    streets: dict[int, tuple[list[int], dict[str, str], int]] = {}
    buildings: dict[int, list[int]] = {}
    for obj in osmium.FileProcessor(str(extract), osmium.osm.NODE | osmium.osm.WAY):
        if isinstance(obj, osmium.osm.Node):
            nodes[obj.id] = (obj.location.lon, obj.location.lat)
        elif isinstance(obj, osmium.osm.Way):
            refs = [n.ref for n in obj.nodes]
            if obj.tags.get("name") == STREET and obj.tags.get("highway"):
                streets[obj.id] = (refs, {t.k: t.v for t in obj.tags}, obj.version)
            elif obj.tags.get("building") and refs[0] == refs[-1] and all(r in nodes for r in refs):
                buildings[obj.id] = refs
    if not streets:
        raise SystemExit(f"demo: no street {STREET} in {extract}")
    street_nodes = [nodes[r] for refs, _t, _v in streets.values() for r in refs if r in nodes]
    lon = sum(p[0] for p in street_nodes) / len(street_nodes)
    lat = sum(p[1] for p in street_nodes) / len(street_nodes)

    def distance(nid: int) -> float:
        x, y = nodes[nid]
        return math.hypot((x - lon) * math.cos(math.radians(lat)), y - lat)

    # The building corner nearest the street's middle: moved ~15 m away from it.
    corner = min((r for refs in buildings.values() for r in refs[:-1]), key=distance)
    cx, cy = nodes[corner]
    moved = (
        cx + (cx - lon) / max(distance(corner), 1e-9) * 0.00025,
        cy + (cy - lat) / max(distance(corner), 1e-9) * 0.00012,
    )
    # A new 20 m x 15 m building a little north-east of the street's middle.
    bx, by = lon + 0.0006, lat + 0.0003
    square = [(bx, by), (bx + 0.00036, by), (bx + 0.00036, by + 0.000135), (bx, by + 0.000135)]
    new_nodes = [_node(NEW_BUILDING_ID + 1 + i, x, y, 1) for i, (x, y) in enumerate(square)]
    ring = [NEW_BUILDING_ID + 1 + i for i in range(4)] + [NEW_BUILDING_ID + 1]
    building = (
        f'<way id="{NEW_BUILDING_ID}" version="1">'
        + "".join(f'<nd ref="{r}"/>' for r in ring)
        + _tags({"building": "yes", "name": "Qbroker House"})
        + "</way>"
    )
    renamed = [
        f'<way id="{wid}" version="{version + 1}">'
        + "".join(f'<nd ref="{r}"/>' for r in refs)
        + _tags({**tags, "name": NEW_NAME})
        + "</way>"
        for wid, (refs, tags, version) in streets.items()
    ]
    text = "\n".join(
        [
            '<?xml version="1.0" encoding="UTF-8"?>',
            '<osmChange version="0.6" generator="qbroker demo">',
            "<modify>",
            _node(corner, *moved, 99),
            *renamed,
            "</modify>",
            "<create>",
            *new_nodes,
            building,
            "</create>",
            "</osmChange>",
            "",
        ]
    )
    return DemoEdit(
        centre=(lon, lat), streets=sorted(streets), moved_node=corner, new_building=NEW_BUILDING_ID, text=text
    )


def publish(source: Path, sequence: int, text: str, timestamp: str) -> Path:
    """Publish ``text`` as diff ``sequence`` (``publish_diff``: the diff and its state file first, ``state.txt``
    last)."""
    return publish_diff(source, sequence, gzip.compress(text.encode()), timestamp)
