"""The store lookups of a diff's resolution: on the driver (small steps) or by Spark tasks (bigger ones,
or ``driver_lookup_bytes=0``), with the same result either way; and the tile math after them, on the
driver (expire_local) or in Spark, with the same metatiles.

test_spark_store_expire checks the expiry against an oracle with the default (driver) lookups; here the
Spark lookups, and a budget that sends only part of a step to Spark, must give the very same points,
segments and counts on a diff with every kind of change.
"""

# ruff: noqa: F811 - the osmstore fixtures are imported by name and then requested as parameters
from __future__ import annotations

import random
from pathlib import Path

import pytest

from harness.osm import Extract, node_xml, osc, read_extract, way_xml, write_osc
from services.osmstore.geometry import GeometryStore
from services.osmstore.osc_diff import read_diff
from services.spark_bridge.expire_collect import collect, metatile_rows
from services.spark_bridge.expire_job import ExpireParams, expired_metatiles
from services.spark_bridge.expire_local import expire_on_driver
from services.spark_bridge.store_expire import StoreResolution, resolve
from services.spark_bridge.store_job import base_tiles, segments_frame
from services.spark_bridge.store_lookup import StoreLookups, estimated_bytes
from tests.services.osmstore.conftest import helsinki, imported_store, osm_data, store  # noqa: F401 - fixtures

ZOOM = 17


@pytest.fixture(scope="module")
def extract(helsinki: Path) -> Extract:
    return read_extract(helsinki)


def mixed_diff(extract: Extract, path: Path) -> Path:
    """Moved, deleted and new nodes, tag edits, deleted and new ways, a multipolygon changing a member,
    and objects the store does not know."""
    rng = random.Random(7)
    nodes = rng.sample(sorted(extract.nodes), 300)
    ways = rng.sample(sorted(w for w, (refs, _) in extract.ways.items() if refs), 60)
    rel = next(
        r
        for r, (members, tags) in sorted(extract.relations.items())
        if tags.get("type") == "multipolygon" and 2 <= len(members) <= 6
    )
    members, _ = extract.relations[rel]
    mxml = "".join(
        f'<member type="{t}" ref="{ref}" role="{role}"/>' for t, ref, role in [*members[:-1], ("w", ways[0], "outer")]
    )
    modify = [node_xml(n, extract.nodes[n][0] + 2e-4, extract.nodes[n][1] - 1e-4, version=5) for n in nodes[:250]]
    modify += [way_xml(w, extract.ways[w][0], {**extract.ways[w][1], "note": "x"}, version=5) for w in ways[:40]]
    modify += [
        f'<relation id="{rel}" version="5">{mxml}<tag k="type" v="multipolygon"/></relation>',
        node_xml(9_200_000_001, 10.0, 50.0, version=7),
        way_xml(9_200_000_100, [9_200_000_001, 9_200_000_002], {"highway": "path"}, version=3),
    ]
    delete = [f'<node id="{n}" version="6"/>' for n in nodes[250:]]
    delete += [f'<way id="{w}" version="6"/>' for w in ways[40:]]
    first = extract.ways[ways[1]][0][0]
    create = [
        node_xml(9_100_000_001, 24.944, 60.170, version=1),
        way_xml(9_100_000_100, [first, 9_100_000_001, 9_100_000_002], {"highway": "footway"}, version=1),
    ]
    return write_osc(path, osc(create=create, modify=modify, delete=delete))


def rows(resolution: StoreResolution) -> list[tuple[float, ...]]:
    table = resolution.segments
    return sorted(zip(*(table[c].to_pylist() for c in ("lon0", "lat0", "lon1", "lat1")), strict=True))


def test_driver_and_spark_lookups_resolve_alike(spark, store: Path, extract: Extract, tmp_path: Path) -> None:
    diff = read_diff(mixed_diff(extract, tmp_path / "mixed.osc.gz"))
    geometry = GeometryStore.of_store(store)
    manifest = geometry.manifest()
    on_driver = resolve(spark, diff, geometry, manifest, ZOOM)
    in_spark = resolve(spark, diff, geometry, manifest, ZOOM, driver_lookup_bytes=0)
    # Enough for the nodes and node_ways lookups but not for the relations' too: step 1 is split.
    split = estimated_bytes("nodes", set(diff.nodes)) + estimated_bytes("node_ways", set(diff.nodes)) + 1
    partly = resolve(spark, diff, geometry, manifest, ZOOM, driver_lookup_bytes=split)
    assert rows(on_driver) == rows(in_spark) == rows(partly)
    assert on_driver.counts == in_spark.counts == partly.counts
    counts = on_driver.counts  # moved: 250 moved, 50 deleted, 2 without a stored position
    assert counts["moved_nodes"] == 302 and counts["unknown_nodes"] == 1 and counts["unknown_ways"] == 1
    assert counts["unknown_relations"] == 0 and counts["missing_node_refs"] >= 1 and counts["most_way_samples"] > 0
    assert counts["parent_relations"] > 10  # the relations of the changed ways and moved nodes, in both paths


def test_lookups_go_to_spark_past_the_budget(spark, store: Path, extract: Extract) -> None:
    geometry = GeometryStore.of_store(store)
    manifest = geometry.manifest()
    ids = set(sorted(extract.nodes)[:100])
    small = StoreLookups(spark, geometry, manifest)
    tight = StoreLookups(spark, geometry, manifest, driver_bytes=estimated_bytes("nodes", ids) - 1)
    a = small.fetch({"n": ("nodes", ids), "none": ("way_nodes", set())})
    b = tight.fetch({"n": ("nodes", ids), "none": ("way_nodes", set())})
    assert (small.spark_steps, tight.spark_steps) == (0, 1)
    assert a["n"].sort_by("id").to_pylist() == b["n"].sort_by("id").to_pylist()
    assert len(a["n"]) == 100 and a["none"].num_rows == b["none"].num_rows == 0
    assert a["n"].column_names == b["n"].column_names == ["id", "lon", "lat"]


def test_driver_and_spark_expiry_agree(spark, store: Path, extract: Extract, tmp_path: Path) -> None:
    diff = read_diff(mixed_diff(extract, tmp_path / "mixed.osc.gz"))
    geometry = GeometryStore.of_store(store)
    segments = resolve(spark, diff, geometry, geometry.manifest(), ZOOM).segments
    for low in (0, 12):  # z0-2 share metatile 0/0
        frame = base_tiles(segments_frame(spark, segments), ZOOM)
        in_spark = collect([metatile_rows(expired_metatiles(frame, ExpireParams(low, ZOOM), None))]).metatiles
        on_driver = expire_on_driver(segments, low, ZOOM).metatiles
        assert on_driver.num_rows > 10
        assert on_driver.to_pydict() == in_spark.to_pydict()  # the same rows in the same (publishing) order
