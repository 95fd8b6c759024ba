"""Generate the demo dataset: Port Qbroker, a fictional island town in the North Atlantic.

Deterministic (fixed seed): running it again reproduces the committed GeoJSON byte for byte. Coordinates
are written in Web Mercator metres (EPSG:3857) so Mapnik draws them without reprojection; the style's
layers declare that SRS. Run: ``python services/tiles/data/generate_town.py``.

Layers: ``land.geojson`` (the island, its coastline), ``water.geojson`` (lake; river as a line in
``waterways.geojson``), ``landuse.geojson`` (forest, parks, harbour), ``roads.geojson`` (named ring road,
avenues and a street grid), ``buildings.geojson``, ``places.geojson`` (town and village labels).
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent
CENTER_LON, CENTER_LAT = -19.95, 45.04  # open ocean: nothing real is hidden under the town
EARTH_RADIUS = 6378137.0

Point = tuple[float, float]


def to_mercator(lon: float, lat: float) -> Point:
    x = math.radians(lon) * EARTH_RADIUS
    y = math.log(math.tan(math.pi / 4 + math.radians(lat) / 2)) * EARTH_RADIUS
    return x, y


CX, CY = to_mercator(CENTER_LON, CENTER_LAT)
# Ground metres to Web Mercator metres at this latitude.
SCALE = 1 / math.cos(math.radians(CENTER_LAT))


def local(east: float, north: float) -> Point:
    """A point ``east``/``north`` ground metres from the town centre, in Web Mercator."""
    return CX + east * SCALE, CY + north * SCALE


def rounded(points: list[Point]) -> list[list[float]]:
    return [[round(x, 1), round(y, 1)] for x, y in points]


def noisy_ring(
    east: float, north: float, radius: float, rng: random.Random, n: int = 120, wobble: float = 0.12
) -> list[Point]:
    phases = [rng.uniform(0, 2 * math.pi) for _ in range(4)]
    ring = []
    for i in range(n):
        a = 2 * math.pi * i / n
        r = radius * (1 + wobble * sum(math.sin((k + 2) * a + p) / (k + 1) for k, p in enumerate(phases)))
        ring.append(local(east + r * math.cos(a), north + r * math.sin(a)))
    return ring + [ring[0]]


def rect(east: float, north: float, w: float, h: float, angle: float = 0.0) -> list[Point]:
    ca, sa = math.cos(angle), math.sin(angle)
    corners = [(-w / 2, -h / 2), (w / 2, -h / 2), (w / 2, h / 2), (-w / 2, h / 2), (-w / 2, -h / 2)]
    return [local(east + x * ca - y * sa, north + x * sa + y * ca) for x, y in corners]


def feature(geom_type: str, coords: object, **props: object) -> dict:
    return {"type": "Feature", "properties": props, "geometry": {"type": geom_type, "coordinates": coords}}


def write(name: str, features: list[dict]) -> None:
    doc = {"type": "FeatureCollection", "features": features}
    (OUT / name).write_text(json.dumps(doc, separators=(",", ":")) + "\n")


STREET_NAMES = [
    "Harbour Street",
    "Queue Lane",
    "Broker Row",
    "Exchange Road",
    "Binding Way",
    "Routing Key Street",
    "Topic Lane",
    "Fanout Terrace",
    "Consumer Close",
    "Publisher Street",
    "Channel Walk",
    "Vhost Avenue",
    "Prefetch Lane",
    "Ack Street",
    "Nack Alley",
    "Mill Road",
    "Church Street",
    "Market Street",
    "Lighthouse Road",
    "Quay Street",
    "Rope Walk",
    "Fisher Lane",
]


def main() -> None:
    rng = random.Random(20260422)
    write(
        "land.geojson",
        [feature("Polygon", [rounded(noisy_ring(0, 0, 5200, rng, n=240, wobble=0.08))], name="Qbroker Island")],
    )
    lake = noisy_ring(-2300, 1900, 520, rng, n=60)
    write("water.geojson", [feature("Polygon", [rounded(lake)], name="Mirror Lake", kind="lake")])
    river = [local(-2300 + 400 * i - 60 * math.sin(i), 1900 - 500 * i + 40 * math.cos(2 * i)) for i in range(1, 9)]
    write("waterways.geojson", [feature("LineString", rounded(river), name="Sable River", kind="river")])

    landuse = [
        feature(
            "Polygon", [rounded(noisy_ring(1400, 3000, 1000, rng, n=80, wobble=0.2))], kind="forest", name="Northwood"
        ),
        feature(
            "Polygon", [rounded(noisy_ring(-3000, -1500, 700, rng, n=60, wobble=0.2))], kind="forest", name="Westwood"
        ),
        feature("Polygon", [rounded(rect(2600, -2400, 700, 300, 0.3))], kind="harbour", name="Harbour"),
    ]
    parks = [(2, 2), (-3, 1), (1, -3)]
    spacing, half = 160.0, 7
    for bx, by in parks:
        park_name = STREET_NAMES[(bx * 7 + by) % len(STREET_NAMES)].split()[0] + " Park"
        outline = rect((bx + 0.5) * spacing, (by + 0.5) * spacing, spacing - 24, spacing - 24)
        landuse.append(feature("Polygon", [rounded(outline)], kind="park", name=park_name))
    write("landuse.geojson", landuse)

    roads = [
        feature(
            "LineString",
            [rounded(noisy_ring(0, 0, 3300, rng, n=90, wobble=0.05))][0],
            name="Ring Road",
            highway="primary",
        )
    ]
    for i, avenue in enumerate(["North Avenue", "East Avenue", "South Avenue", "West Avenue"]):
        a = math.pi / 2 - i * math.pi / 2 + 0.2
        pts = [
            local(r * math.cos(a + 0.05 * math.sin(r / 500)), r * math.sin(a + 0.05 * math.sin(r / 500)))
            for r in range(int(half * spacing), 3400, 150)
        ]
        roads.append(feature("LineString", rounded(pts), name=avenue, highway="secondary"))
    edge = half * spacing
    for i in range(-half, half + 1):
        roads.append(
            feature(
                "LineString",
                rounded([local(i * spacing, -edge), local(i * spacing, edge)]),
                name=STREET_NAMES[(i + half) % len(STREET_NAMES)],
                highway="residential",
            )
        )
        roads.append(
            feature(
                "LineString",
                rounded([local(-edge, i * spacing), local(edge, i * spacing)]),
                name=STREET_NAMES[(i + half + 9) % len(STREET_NAMES)],
                highway="residential",
            )
        )
    write("roads.geojson", roads)

    buildings = []
    for bx in range(-half, half):
        for by in range(-half, half):
            if (bx, by) in parks or (bx + 0.5) ** 2 + (by + 0.5) ** 2 > (half - 0.5) ** 2:
                continue
            cx, cy = (bx + 0.5) * spacing, (by + 0.5) * spacing
            for side in range(4):
                for k in range(rng.randint(2, 3)):
                    along = -45 + 45 * k + rng.uniform(-8, 8)
                    depth = 45
                    w, h = rng.uniform(18, 30), rng.uniform(14, 24)
                    ex, ny = [(along, -depth), (depth, along), (along, depth), (-depth, along)][side]
                    buildings.append(feature("Polygon", [rounded(rect(cx + ex, cy + ny, w, h))], building="yes"))
    write("buildings.geojson", buildings)

    write(
        "places.geojson",
        [
            feature("Point", rounded([local(0, 60)])[0], name="Port Qbroker", place="town"),
            feature("Point", rounded([local(-2600, -2900)])[0], name="Westby", place="village"),
            feature("Point", rounded([local(3100, 1800)])[0], name="Eastholm", place="village"),
            feature("Point", rounded([local(0, 200)])[0], name="Qbroker Island", place="island"),
        ],
    )


if __name__ == "__main__":
    main()
