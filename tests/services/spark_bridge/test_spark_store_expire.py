"""Expiry against the geometry store of the real Helsinki extract, on the shared local Spark session.

Each kind of change is checked against tiles computed in the test from the geometry pyosmium read
(store_oracle): what must be expired is, and nothing beyond the 0.1-tile buffer of the old and new
geometry is. The store is a fresh copy per test (tests/services/osmstore/conftest.py imports it once).
"""

# ruff: noqa: F811 - the osmstore fixtures are imported by name and then requested as parameters
from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from store_oracle import Expected

from harness import HANG
from harness.osm import Extract, coastline_node, node_xml, osc, read_extract, way_xml, write_osc
from services.osmstore.geometry import GeometryStore
from services.spark_bridge.expire_job import ExpireParams, ExpireTooLarge
from services.spark_bridge.job_context import JobContext
from services.spark_bridge.sea_refresh import SeaRefresher
from services.spark_bridge.store_job import StoreJob, run_store_expire
from tests.services.osmstore.conftest import helsinki, imported_store, osm_data, store  # noqa: F401 - fixtures

MIN_Z, MAX_Z = 13, 17


@pytest.fixture(scope="module")
def extract(helsinki: Path) -> Extract:
    return read_extract(helsinki)


def run(spark, store: Path, diff: Path, sequence: int | None = None, apply: bool = True):
    published: list[str] = []
    ctx = JobContext("test", spark, None, publish=published.append)
    result = run_store_expire(diff, StoreJob(store, sequence, apply), ExpireParams(MIN_Z, MAX_Z), ctx)
    return result, {t for m in published for t in m.split(";")}


def assert_expires(published: set[str], expected: Expected) -> None:
    must, may = expected.metatiles(MIN_Z)
    assert must <= published, sorted(must - published)[:10]
    assert published <= may, sorted(published - may)[:10]


def coords(extract: Extract, refs: list[int], moved: dict[int, tuple[float, float]] | None = None) -> list:
    located = {**extract.nodes, **(moved or {})}
    return [located[r] for r in refs if r in located]


def whole_ways(extract: Extract, **want: str) -> list[int]:
    return sorted(w for w, (refs, tags) in extract.ways.items()
                  if all(tags.get(k) == v for k, v in want.items()) and all(r in extract.nodes for r in refs))


_USERS: dict[int, dict[int, list[int]]] = {}


def users(extract: Extract, node: int) -> list[int]:
    """Ways using ``node`` (an index built once per extract: a scan per node would dominate the test)."""
    index = _USERS.get(id(extract))
    if index is None:
        index = _USERS[id(extract)] = {}
        for w, (refs, _) in extract.ways.items():
            for r in dict.fromkeys(refs):
                index.setdefault(r, []).append(w)
    return index.get(node, [])


_PARENTS: dict[int, dict[tuple[str, int], list[int]]] = {}


def parents(extract: Extract, ways: set[int] | list[int], nodes: set[int] | list[int] = ()) -> set[int]:
    """The relations osm2pgsql re-processes for changed ``ways`` and moved ``nodes``: those with one of the
    ways as a member, or one of the nodes (as a member or through a way using it)."""
    index = _PARENTS.get(id(extract))
    if index is None:
        index = _PARENTS[id(extract)] = {}
        for r, (members, _) in extract.relations.items():
            for t, ref, _ in members:
                index.setdefault((t, ref), []).append(r)
    via = {w for n in nodes for w in users(extract, n)}
    return ({r for w in {*ways, *via} for r in index.get(("w", w), ())}
            | {r for n in nodes for r in index.get(("n", n), ())})


def expect_relations(expected: Expected, extract: Extract, relations: set[int],
                     moved: dict[int, tuple[float, float]] | None = None) -> set[int]:
    """Each relation's member ways, old and new line (osm2pgsql draws a relation from its ways); returns them."""
    ways: set[int] = set()
    for r in relations:
        for t, ref, _ in extract.relations[r][0]:
            if t == "w":
                if ref in extract.ways:  # the store has the extract's ways, no others
                    ways.add(ref)
                    expected.line(coords(extract, extract.ways[ref][0]), MAX_Z)
                    expected.line(coords(extract, extract.ways[ref][0], moved), MAX_Z)
    return ways


def route_with_members_in_the_extract(extract: Extract) -> int:
    """A route relation with several member ways in the extract and a node member."""
    return next(r for r, (members, tags) in sorted(extract.relations.items())
                if tags.get("type") == "route"
                and sum(1 for t, ref, _ in members if t == "w" and ref in extract.ways) >= 5
                and any(t == "n" and ref in extract.nodes for t, ref, _ in members))


@pytest.mark.parametrize("change", ["member way edited", "member way's node moved", "member node moved"])
def test_a_changed_member_expires_its_whole_relation(spark, store: Path, extract: Extract, tmp_path: Path,
                                                     change: str) -> None:
    """osm2pgsql re-processes the relations of a changed way, of a way whose node moved and of a moved node
    member, and expires each relation's old and new geometry: every member way, not only the changed one."""
    route = route_with_members_in_the_extract(extract)
    members = extract.relations[route][0]
    way = next(ref for t, ref, _ in members if t == "w" and ref in extract.ways
               and all(n in extract.nodes for n in extract.ways[ref][0]))
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


def test_node_move_expires_both_positions_and_every_way_using_it(spark, store: Path, extract: Extract,
                                                                 tmp_path: Path) -> None:
    # A node shared by two streets: neither way is in the diff.
    shared = next(n for n in extract.nodes if len(users(extract, n)) >= 2
                  and all(all(r in extract.nodes for r in extract.ways[w][0]) for w in users(extract, n)))
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
        "Qbrokerinkatu",)


def test_way_with_a_moved_node_not_in_the_diff_and_a_deleted_way(spark, store: Path, extract: Extract,
                                                                   tmp_path: Path) -> None:
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
    rel = next(r for r, (members, tags) in sorted(extract.relations.items())
               if tags.get("type") == "multipolygon" and 2 <= len(members) <= 6
               and all(t == "w" and ref in extract.ways and all(n in extract.nodes for n in extract.ways[ref][0])
                       for t, ref, _ in members))
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
    created = [node_xml(9_100_000_001, *corner, version=1),
               way_xml(9_100_000_100, [first, 9_100_000_001], {"highway": "footway"}, version=1)]
    outside = [node_xml(9_200_000_001, 10.0, 50.0, version=7),  # modified, but never in this region
               way_xml(9_200_000_100, [9_200_000_001, 9_200_000_002], {"highway": "path"}, version=3)]
    result, published = run(spark, store, write_osc(tmp_path / "new.osc", osc(create=created, modify=outside)))
    expected = Expected()
    expected.line([extract.nodes[first], corner], MAX_Z)
    expected.point((10.0, 50.0), MAX_Z)
    expected.line([(10.0, 50.0)], MAX_Z)
    assert_expires(published, expected)
    counts = result["inputs"]
    assert counts["unknown_nodes"] == 1 and counts["unknown_ways"] == 1 and counts["missing_node_refs"] == 1


def test_next_diff_sees_current_geometry_and_replay_changes_nothing(spark, store: Path, extract: Extract,
                                                                    tmp_path: Path) -> None:
    way = whole_ways(extract, highway="unclassified")[0]
    refs, tags = extract.ways[way]
    new = (extract.nodes[refs[0]][0] + 0.002, extract.nodes[refs[0]][1])
    move = write_osc(tmp_path / "1.osc", osc(modify=[node_xml(refs[0], *new)]))
    first, _ = run(spark, store, move, sequence=1)
    assert first["store"]["applied"] is True and first["store"]["sequence"] == 1
    rename = write_osc(tmp_path / "2.osc", osc(modify=[way_xml(way, refs, {**tags, "name": "Uusi"})]))
    second, published = run(spark, store, rename, sequence=2)
    expected = Expected()
    expected.line(coords(extract, refs, {refs[0]: new}), MAX_Z)  # the moved node's *current* place
    for r in parents(extract, [way]):
        for t, ref, _ in extract.relations[r][0]:
            if t == "w" and ref in extract.ways:
                expected.line(coords(extract, extract.ways[ref][0], {refs[0]: new}), MAX_Z)
    assert_expires(published, expected)
    assert GeometryStore.of_store(store).sequence == 2
    again, republished = run(spark, store, move, sequence=1)
    assert again["store"] == {"applied": False, "sequence": 2,
                              "replay": "sequence 1 is already applied (the store is at 2)"}
    assert republished == set() and again["total_tiles"] == 0
    with pytest.raises(Exception, match="diffs 3..4 are missing"):
        run(spark, store, write_osc(tmp_path / "5.osc", osc(modify=[node_xml(refs[1], *new)])), sequence=5)
    assert GeometryStore.of_store(store).sequence == 2


@pytest.mark.parametrize("cap", ["max_tiles_per_geometry", "max_tiles"])
def test_a_guard_tripping_applies_nothing(spark, store: Path, extract: Extract, tmp_path: Path, cap: str) -> None:
    way = next(w for w in whole_ways(extract, highway="unclassified") if len(extract.ways[w][0]) >= 4)
    refs, tags = extract.ways[way]
    diff = write_osc(tmp_path / "g.osc", osc(modify=[way_xml(way, refs, {**tags, "name": "Never"})]))
    published: list[str] = []
    ctx = JobContext("test", spark, None, publish=published.append)
    params = ExpireParams(MIN_Z, MAX_Z, **{cap: 3})
    with pytest.raises(ExpireTooLarge, match=cap):
        run_store_expire(diff, StoreJob(store, 1, True), params, ctx)
    assert published == []
    assert GeometryStore.of_store(store).manifest().commits == 0
    db = sqlite3.connect(store / "render.sqlite")
    assert db.execute("SELECT count(*) FROM roads WHERE name = 'Never'").fetchone()[0] == 0


def test_rerun_after_a_crash_between_the_two_commits(spark, store: Path, extract: Extract, tmp_path: Path) -> None:
    """The rendering store already holds diff 1 (the bridge died before the geometry commit): running diff 1
    again skips the rendering store, still expires from the old geometry, and commits the geometry store."""
    from services.osmstore.render_store import apply_osc

    way = whole_ways(extract, highway="unclassified")[1]
    refs, tags = extract.ways[way]
    moved = refs[0]
    new = (extract.nodes[moved][0] + 0.001, extract.nodes[moved][1])
    diff = write_osc(tmp_path / "1.osc", osc(modify=[node_xml(moved, *new)]))
    assert "nodes_modified" in apply_osc(store, diff, sequence=1)
    result, published = run(spark, store, diff, sequence=1)
    assert result["store"]["render"] == {"skipped": 1} and result["store"]["applied"] is True
    expected = Expected()
    expected.point(extract.nodes[moved], MAX_Z)
    for w in users(extract, moved):
        expected.line(coords(extract, extract.ways[w][0]), MAX_Z)  # old geometry: from the geometry store
        expected.line(coords(extract, extract.ways[w][0], {moved: new}), MAX_Z)
    expect_relations(expected, extract, parents(extract, [], [moved]), {moved: new})
    assert_expires(published, expected)
    assert GeometryStore.of_store(store).sequence == 1


def test_a_job_stopped_after_the_rendering_store_was_prepared_applies_nothing(spark, store: Path, extract: Extract,
                                                                               tmp_path: Path) -> None:
    """The rendering store's transaction is built while Spark resolves the diff and committed only once the
    expiry succeeded: a job cancelled in between rolls it back and publishes nothing."""
    from services.spark_bridge.job_context import JobCancelled

    way = next(w for w in whole_ways(extract, highway="unclassified") if len(extract.ways[w][0]) >= 4)
    refs, tags = extract.ways[way]
    diff = write_osc(tmp_path / "c.osc", osc(modify=[way_xml(way, refs, {**tags, "name": "Cancelled"})]))

    class CancelAfterResolving(JobContext):
        def count(self, name: str, value: int | float) -> None:
            super().count(name, value)
            if name == "ways":  # the resolution's counts: the rendering store is being prepared meanwhile
                self.cancel_requested.set()

    db = sqlite3.connect(store / "render.sqlite")
    meta_before = db.execute("SELECT key, value FROM meta ORDER BY key").fetchall()
    published: list[str] = []
    ctx = CancelAfterResolving("test", spark, None, publish=published.append)
    with pytest.raises(JobCancelled):
        run_store_expire(diff, StoreJob(store, 1, True), ExpireParams(MIN_Z, MAX_Z), ctx)
    assert published == []
    assert GeometryStore.of_store(store).manifest().commits == 0
    assert db.execute("SELECT count(*) FROM roads WHERE name = 'Cancelled'").fetchone()[0] == 0
    assert db.execute("SELECT key, value FROM meta ORDER BY key").fetchall() == meta_before
    # The same diff then goes through whole.
    result, published_now = run(spark, store, diff, sequence=1)
    assert result["store"]["applied"] is True and published_now
    assert db.execute("SELECT count(*) FROM roads WHERE name = 'Cancelled'").fetchone()[0] > 0


def test_a_coastline_edit_refreshes_the_sea_and_expires_again(spark, store: Path, extract: Extract,
                                                              tmp_path: Path) -> None:
    """After the job, the bridge rebuilds the sea in the background and publishes the job's metatiles again
    (tiles re-rendered before the sea was rebuilt show the old one along the edited coast)."""
    nid = coastline_node(extract)
    lon, lat = extract.nodes[nid]
    diff = write_osc(tmp_path / "coast.osc", osc(modify=[node_xml(nid, lon + 0.001, lat)]))
    published: list[str] = []
    sea = SeaRefresher(store)
    result = run_store_expire(diff, StoreJob(store, 1, True, sea=sea), ExpireParams(MIN_Z, MAX_Z),
                              JobContext("test", spark, None, publish=published.append))
    assert result["store"]["render"]["sea_stale"] == 1
    assert sea.wait_idle(5 * HANG) and sea.refreshes == 1
    sent = result["published"]["messages"]
    assert sent and published[sent:] == published[:sent]  # the same expirations, once more
    stale = sqlite3.connect(store / "render.sqlite").execute("SELECT value FROM meta WHERE key = 'sea_stale'")
    assert stale.fetchone() is None
