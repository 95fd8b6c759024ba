"""Which tiles a change expires, against the geometry store of the real Helsinki extract, on the shared
local Spark session.

Each kind of change is checked against tiles computed in the test from the geometry pyosmium read
(store_oracle): what must be expired is, and nothing beyond the 0.1-tile buffer of the old and new
geometry is. The store is a fresh copy per test (tests/services/osmstore/conftest.py imports it once).
The store job's sequence, replays, guards and failures: test_spark_store_commits.py.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from store_expire_helpers import MAX_Z, assert_expires, coords, expect_relations, parents, run, users, whole_ways
from store_oracle import Expected

from harness.osm import Extract, node_xml, osc, way_xml, write_osc
from services.osmstore.geometry import GeometryStore


def route_with_members_in_the_extract(extract: Extract) -> int:
    """A route relation with several member ways in the extract and a node member."""
    return next(
        r
        for r, (members, tags) in sorted(extract.relations.items())
        if tags.get("type") == "route"
        and sum(1 for t, ref, _ in members if t == "w" and ref in extract.ways) >= 5
        and any(t == "n" and ref in extract.nodes for t, ref, _ in members)
    )


@pytest.mark.parametrize("change", ["member way edited", "member way's node moved", "member node moved"])
def test_a_changed_member_expires_its_whole_relation(
    spark, store: Path, extract: Extract, tmp_path: Path, change: str
) -> None:
    """osm2pgsql re-processes the relations of a changed way, of a way whose node moved and of a moved node
    member, and expires each relation's old and new geometry: every member way, not only the changed one."""
    route = route_with_members_in_the_extract(extract)
    members = extract.relations[route][0]
    way = next(
        ref
        for t, ref, _ in members
        if t == "w" and ref in extract.ways and all(n in extract.nodes for n in extract.ways[ref][0])
    )
    refs, tags = extract.ways[way]
    member_node = next(ref for t, ref, _ in members if t == "n" and ref in extract.nodes)
    moved: dict[int, tuple[float, float]] = {}
    if change == "member way edited":
        diff = osc(modify=[way_xml(way, refs, {**tags, "note": "edited"})])
        changed, nodes = [way], []
    else:
        node = refs[len(refs) // 2] if change == "member way's node moved" else member_node
        moved[node] = (extract.nodes[node][0] + 0.0004, extract.nodes[node][1] - 0.0002)
        diff = osc(modify=[node_xml(node, *moved[node])])
        changed, nodes = [], [node]
    result, published = run(spark, store, write_osc(tmp_path / "member.osc", diff))
    expected = Expected()
    for node, where in moved.items():
        expected.point(extract.nodes[node], MAX_Z)
        expected.point(where, MAX_Z)
    relations = parents(extract, changed, nodes)
    assert route in relations
    ways = expect_relations(expected, extract, relations, moved)
    for w in {*changed, *(w for n in nodes for w in users(extract, n))}:
        ways.add(w)
        expected.line(coords(extract, extract.ways[w][0]), MAX_Z)
        expected.line(coords(extract, extract.ways[w][0], moved), MAX_Z)
    assert_expires(published, expected)
    assert result["inputs"]["parent_relations"] == len(relations) and result["inputs"]["ways"] == len(ways)


def test_node_move_expires_both_positions_and_every_way_using_it(
    spark, store: Path, extract: Extract, tmp_path: Path
) -> None:
    # A node shared by two streets: neither way is in the diff.
    shared = next(
        n
        for n in extract.nodes
        if len(users(extract, n)) >= 2
        and all(all(r in extract.nodes for r in extract.ways[w][0]) for w in users(extract, n))
    )
    lon, lat = extract.nodes[shared]
    new = (lon + 0.0015, lat + 0.0007)
    result, published = run(spark, store, write_osc(tmp_path / "move.osc", osc(modify=[node_xml(shared, *new)])))
    expected = Expected()
    expected.point((lon, lat), MAX_Z)
    expected.point(new, MAX_Z)
    for way in users(extract, shared):
        refs = extract.ways[way][0]
        expected.line(coords(extract, refs), MAX_Z)
        expected.line(coords(extract, refs, {shared: new}), MAX_Z)
    ways = expect_relations(expected, extract, parents(extract, [], [shared]), {shared: new})
    assert_expires(published, expected)
    assert result["inputs"]["ways"] == len(ways | set(users(extract, shared)))
    assert result["inputs"]["moved_nodes"] == 1
    assert result["store"]["applied"] is True


def test_tag_only_way_edit_expires_its_whole_geometry(spark, store: Path, extract: Extract, tmp_path: Path) -> None:
    way = next(w for w in whole_ways(extract, highway="unclassified") if len(extract.ways[w][0]) >= 4)
    refs, tags = extract.ways[way]
    diff = write_osc(tmp_path / "rename.osc", osc(modify=[way_xml(way, refs, {**tags, "name": "Qbrokerinkatu"})]))
    result, published = run(spark, store, diff)
    expected = Expected()
    expected.line(coords(extract, refs), MAX_Z)
    expect_relations(expected, extract, parents(extract, [way]))
    assert_expires(published, expected)
    assert result["inputs"]["missing_node_refs"] == 0 and result["inputs"]["unknown_ways"] == 0
    # The same diff renamed the street in the rendering store.
    db = sqlite3.connect(store / "render.sqlite")
    assert db.execute("SELECT name FROM roads WHERE osm_type = 'w' AND osm_id = ?", (way,)).fetchone() == (
        "Qbrokerinkatu",
    )


def test_way_with_a_moved_node_not_in_the_diff_and_a_deleted_way(
    spark, store: Path, extract: Extract, tmp_path: Path
) -> None:
    """The diff moves one node of way A (A is not in it) and deletes way B (without nodes, as the API does)."""
    ways = whole_ways(extract, building="yes")
    a, b = ways[0], ways[-1]
    a_refs, _ = extract.ways[a]
    b_refs, b_tags = extract.ways[b]
    moved = a_refs[1]
    new = (extract.nodes[moved][0] - 0.001, extract.nodes[moved][1])
    deletion = f'<way id="{b}" version="9"/>'
    diff = write_osc(tmp_path / "d.osc.gz", osc(modify=[node_xml(moved, *new)], delete=[deletion]))
    result, published = run(spark, store, diff)
    expected = Expected()
    expected.point(extract.nodes[moved], MAX_Z)
    expected.point(new, MAX_Z)
    for way in users(extract, moved):
        expected.line(coords(extract, extract.ways[way][0]), MAX_Z)
        expected.line(coords(extract, extract.ways[way][0], {moved: new}), MAX_Z)
    expected.line(coords(extract, b_refs), MAX_Z)  # its old geometry, from the store
    expect_relations(expected, extract, parents(extract, [b], [moved]), {moved: new})
    assert_expires(published, expected)
    with closing(GeometryStore.of_store(store).reader()) as conn:
        assert conn.execute("SELECT count(*) FROM ways WHERE id = ?", (b,)).fetchone() == (0,)
    assert result["inputs"]["unknown_ways"] == 0


def test_multipolygon_member_change(spark, store: Path, extract: Extract, tmp_path: Path) -> None:
    """A multipolygon loses one outer way and gains another: both ways' geometry expires, and the rest."""
    rel = next(
        r
        for r, (members, tags) in sorted(extract.relations.items())
        if tags.get("type") == "multipolygon"
        and 2 <= len(members) <= 6
        and all(
            t == "w" and ref in extract.ways and all(n in extract.nodes for n in extract.ways[ref][0])
            for t, ref, _ in members
        )
    )
    members, tags = extract.relations[rel]
    gained = next(w for w in whole_ways(extract, building="yes") if w not in {m[1] for m in members})
    new_members = [*members[:-1], ("w", gained, "outer")]
    mxml = "".join(f'<member type="{t}" ref="{ref}" role="{role}"/>' for t, ref, role in new_members)
    tag_xml = "".join(f'<tag k="{k}" v="{v}"/>' for k, v in tags.items() if '"' not in v and "&" not in v)
    diff = write_osc(tmp_path / "mp.osc", osc(modify=[f'<relation id="{rel}" version="5">{mxml}{tag_xml}</relation>']))
    result, published = run(spark, store, diff)
    expected = Expected()
    for _t, ref, _r in [*members, ("w", gained, "outer")]:
        expected.line(coords(extract, extract.ways[ref][0]), MAX_Z)
    assert_expires(published, expected)
    assert result["inputs"]["unknown_relations"] == 0 and result["inputs"]["ways"] == len(members) + 1


def test_new_way_and_objects_the_store_does_not_know(spark, store: Path, extract: Extract, tmp_path: Path) -> None:
    street = whole_ways(extract, highway="residential")[0]
    first = extract.ways[street][0][0]
    corner = (24.9440, 60.1700)
    created = [
        node_xml(9_100_000_001, *corner, version=1),
        way_xml(9_100_000_100, [first, 9_100_000_001], {"highway": "footway"}, version=1),
    ]
    outside = [
        node_xml(9_200_000_001, 10.0, 50.0, version=7),  # modified, but never in this region
        way_xml(9_200_000_100, [9_200_000_001, 9_200_000_002], {"highway": "path"}, version=3),
    ]
    result, published = run(spark, store, write_osc(tmp_path / "new.osc", osc(create=created, modify=outside)))
    expected = Expected()
    expected.line([extract.nodes[first], corner], MAX_Z)
    expected.point((10.0, 50.0), MAX_Z)
    expected.line([(10.0, 50.0)], MAX_Z)
    assert_expires(published, expected)
    counts = result["inputs"]
    assert counts["unknown_nodes"] == 1 and counts["unknown_ways"] == 1 and counts["missing_node_refs"] == 1
