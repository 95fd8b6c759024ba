"""The geometry store (SQLite keyed by id, for expiry) built by the import pass, and diffs applied to it."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from harness.osm import Extract, node_xml, osc, read_extract, relation_xml, way_xml, write_osc
from services.osmstore.geometry import FORMAT_VERSION, GeometryStore, SequenceGap
from services.osmstore.geometry_apply import apply_diff
from services.osmstore.osc_diff import read_diff
from services.osmstore.osc_input import UnreadableOsc


@pytest.fixture(scope="module")
def extract(helsinki: Path) -> Extract:
    return read_extract(helsinki)


QUERIES = {
    "nodes": "SELECT id, lon, lat FROM nodes",
    "way_nodes": "SELECT w.id AS way_id, r.key AS seq, r.value AS node_id FROM ways w, json_each(w.nodes) r",
    "node_ways": "SELECT node_id, way_id FROM node_ways",
    "node_relations": "SELECT node_id, rel_id FROM node_relations",
    "way_relations": "SELECT way_id, rel_id FROM way_relations",
    "members": "SELECT r.id AS rel_id, m.key AS seq, m.value ->> 0 AS member_type, m.value ->> 1 AS member_id, "
    "m.value ->> 2 AS role FROM relations r, json_each(r.members) m",
    "meta": "SELECT key, value FROM meta",
}


def _table(store: Path, name: str) -> list[dict]:
    with closing(GeometryStore.of_store(store).reader()) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute(QUERIES[name])]


def _digest(store: Path) -> str:
    h = hashlib.sha256()
    for name in QUERIES:
        rows = sorted(tuple(sorted(r.items())) for r in _table(store, name))
        h.update(repr(rows).encode())
    return h.hexdigest()


def _pages(db: Path) -> list[bytes]:
    with closing(sqlite3.connect(db)) as conn:
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    data = db.read_bytes()
    return [data[i : i + size] for i in range(0, len(data), size)]


def test_import_writes_every_location_and_membership(imported_store: Path, extract: Extract) -> None:
    nodes = {r["id"]: (r["lon"], r["lat"]) for r in _table(imported_store, "nodes")}
    assert nodes == extract.nodes  # both from libosmium's fixed-point locations: exact
    ways: dict[int, list[tuple[int, int]]] = {}
    for r in _table(imported_store, "way_nodes"):
        ways.setdefault(r["way_id"], []).append((r["seq"], r["node_id"]))
    assert {w: [n for _, n in sorted(v)] for w, v in ways.items()} == {w: refs for w, (refs, _) in extract.ways.items()}
    pairs = {(r["node_id"], r["way_id"]) for r in _table(imported_store, "node_ways")}
    assert pairs == {(n, w) for w, (refs, _) in extract.ways.items() for n in refs}
    members: dict[int, list] = {}
    for r in _table(imported_store, "members"):
        members.setdefault(r["rel_id"], []).append((r["seq"], r["member_type"], r["member_id"], r["role"]))
    assert {r: [m[1:] for m in sorted(v)] for r, v in members.items()} == {
        r: ms for r, (ms, _) in extract.relations.items() if ms
    }
    assert_member_relations(imported_store, {r: ms for r, (ms, _) in extract.relations.items()})
    manifest = GeometryStore.of_store(imported_store).manifest()
    assert manifest.sequence is None and manifest.counts["nodes"] == len(extract.nodes) and manifest.commits == 0


def assert_member_relations(store: Path, relations: dict[int, list[tuple[str, int, str]]]) -> None:
    """The member -> relation indexes hold exactly the node and way members of ``relations``."""
    for kind, name in (("n", "node_relations"), ("w", "way_relations")):
        column = "node_id" if kind == "n" else "way_id"
        assert {(r[column], r["rel_id"]) for r in _table(store, name)} == {
            (ref, rel) for rel, members in relations.items() for t, ref, _ in members if t == kind
        }, name


def test_a_store_of_the_previous_format_gets_its_member_indexes(store: Path, extract: Extract) -> None:
    """A format-3 store (no member -> relation indexes) is upgraded in place the first time it is locked."""
    geometry = GeometryStore.of_store(store)
    with closing(sqlite3.connect(geometry.db)) as conn:
        conn.executescript("DROP TABLE node_relations; DROP TABLE way_relations;")
        manifest = json.loads(conn.execute("SELECT value FROM meta WHERE key = 'manifest'").fetchone()[0])
        conn.execute(
            "UPDATE meta SET value = ? WHERE key = 'manifest'", (json.dumps({**manifest, "format_version": 3}),)
        )
        conn.commit()
    assert geometry.manifest().format_version == 3
    with geometry.locked() as locked:
        assert locked.format_version == FORMAT_VERSION
    assert geometry.manifest().format_version == FORMAT_VERSION
    assert_member_relations(store, {r: ms for r, (ms, _) in extract.relations.items()})


def test_a_diff_writes_what_it_changes_not_the_store(store: Path, extract: Extract, tmp_path: Path) -> None:
    """Ten moved nodes and an edited way change a handful of the database file's pages, once checkpointed,
    not the tables they sit in (the copy-on-write Parquet layout rewrote every partition a changed id fell
    in: the whole nodes table of a city store). Through the bridge's writer (kept open, the WAL
    checkpointed in the background), the database file counted page by page."""
    db = store / "geometry" / "geometry.sqlite"
    before = _pages(db)
    wid, (refs, tags) = next(iter(extract.ways.items()))
    moved = list(extract.nodes.items())[1000:1010]
    diff = read_diff(
        write_osc(
            tmp_path / "d.osc",
            osc(modify=[*(node_xml(n, x + 1e-4, y) for n, (x, y) in moved), way_xml(wid, refs, {**tags, "note": "x"})]),
        )
    )
    with GeometryStore(store / "geometry", keep_writer=True) as geo:
        assert apply_diff(geo, diff, sequence=None)["applied"] is True
    after = _pages(db)  # closed: everything is in the file
    changed = sum(1 for old, new in zip(before, after, strict=False) if old != new) + abs(len(after) - len(before))
    assert changed <= 20 and changed < len(before) // 50, f"{changed} of {len(before)} pages changed"
    assert {r["id"]: r["lon"] for r in _table(store, "nodes")}[moved[0][0]] == pytest.approx(moved[0][1][0] + 1e-4)


def test_moved_node_changed_way_deleted_way(store: Path, extract: Extract, tmp_path: Path) -> None:
    (wid, (refs, tags)), (gone, (gone_refs, gone_tags)) = list(extract.ways.items())[:2]
    nid = refs[0]
    lon, lat = extract.nodes[nid]
    text = osc(
        create=[node_xml(9_000_000_001, 24.95, 60.17, version=1)],
        modify=[node_xml(nid, lon + 0.001, lat), way_xml(wid, [*refs, 9_000_000_001], tags)],
        delete=[way_xml(gone, gone_refs, gone_tags, version=9)],
    )
    stats = apply_diff(GeometryStore.of_store(store), read_diff(write_osc(tmp_path / "d.osc", text)), sequence=None)
    assert stats["applied"] is True
    nodes = {r["id"]: (r["lon"], r["lat"]) for r in _table(store, "nodes")}
    assert nodes[nid] == pytest.approx((lon + 0.001, lat)) and nodes[9_000_000_001] == pytest.approx((24.95, 60.17))
    way_rows = [r for r in _table(store, "way_nodes") if r["way_id"] == wid]
    assert [r["node_id"] for r in sorted(way_rows, key=lambda r: r["seq"])] == [*refs, 9_000_000_001]
    assert not [r for r in _table(store, "way_nodes") if r["way_id"] == gone]
    pairs = {(r["node_id"], r["way_id"]) for r in _table(store, "node_ways")}
    assert (9_000_000_001, wid) in pairs and not {p for p in pairs if p[1] == gone}
    assert stats["commits"] == 1 and GeometryStore.of_store(store).manifest().commits == 1


def test_sequence_replay_and_gap(store: Path, extract: Extract, tmp_path: Path) -> None:
    geo = GeometryStore.of_store(store)
    nid, (lon, lat) = next(iter(extract.nodes.items()))
    first = read_diff(write_osc(tmp_path / "1.osc", osc(modify=[node_xml(nid, lon + 0.01, lat)])))
    assert apply_diff(geo, first, sequence=41)["applied"] is True
    assert geo.sequence == 41
    second = read_diff(write_osc(tmp_path / "2.osc", osc(modify=[node_xml(nid, lon + 0.02, lat, version=3)])))
    before = _digest(store)
    replay = apply_diff(geo, second, sequence=40)
    assert replay["applied"] is False and "already applied" in replay["replay"]
    with pytest.raises(SequenceGap, match="42..42 are missing"):
        apply_diff(geo, second, sequence=43)
    same_again = apply_diff(geo, first, sequence=None)  # recognised by its digest
    assert same_again["applied"] is False and "already applied" in same_again["replay"]
    assert _digest(store) == before
    assert apply_diff(geo, second, sequence=42)["applied"] is True and geo.sequence == 42


def test_corrupt_diff_is_refused_before_anything_is_applied(store: Path, extract: Extract, tmp_path: Path) -> None:
    before = _digest(store)
    moves = [node_xml(nid, lon + 0.001, lat) for nid, (lon, lat) in list(extract.nodes.items())[:2000]]
    data = write_osc(tmp_path / "full.osc.gz", osc(modify=moves)).read_bytes()
    cut = tmp_path / "cut.osc.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(UnreadableOsc, match="cut.osc.gz"):
        read_diff(cut)
    assert _digest(store) == before


def test_failure_before_the_commit_leaves_the_store(
    store: Path, extract: Extract, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure after the rows were written, before the commit: the store is as before."""
    from services.osmstore import geometry_apply

    before = _digest(store)
    nid, (lon, lat) = next(iter(extract.nodes.items()))
    diff = read_diff(write_osc(tmp_path / "d.osc", osc(modify=[node_xml(nid, lon + 0.5, lat)])))

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(geometry_apply, "write_manifest", disk_full)
    with pytest.raises(OSError, match="No space"):
        apply_diff(GeometryStore.of_store(store), diff)
    assert _digest(store) == before
    assert GeometryStore.of_store(store).manifest().commits == 0


def test_a_diff_leaves_the_rows_the_extract_with_it_would_have(store: Path, extract: Extract, tmp_path: Path) -> None:
    """Tag edits (node, way, relation), node moves, new and deleted nodes, ways whose node list grew, shrank
    or was replaced, new and deleted ways, relations with new members and deleted ones: every table, the
    reverse index and the manifest's counts are what the extract with the diff applied holds."""
    nodes, ways, rels = (
        dict(extract.nodes),
        {w: list(r) for w, (r, _) in extract.ways.items()},
        {r: list(m) for r, (m, _) in extract.relations.items()},
    )
    way_ids, node_ids = list(ways)[:60], list(nodes)[5000:5010]
    rel_ids = [r for r, m in rels.items() if m][:3]
    shrunk = next(r for r, m in rels.items() if len(m) >= 3 and m[0][0] == "w" and r not in rel_ids)
    create, modify, delete = [], [], []
    create.append(node_xml(9_000_000_001, 24.95, 60.17, version=1))
    nodes[9_000_000_001] = (24.95, 60.17)
    for n in node_ids[:4]:  # moved
        nodes[n] = (nodes[n][0] + 1e-4, nodes[n][1])
        modify.append(node_xml(n, *nodes[n], version=3))
    for n in node_ids[4:8]:  # tags only
        modify.append(node_xml(n, *nodes[n], {"amenity": "bench"}, version=3))
    for w in way_ids[:20]:  # tags only
        modify.append(way_xml(w, ways[w], {"note": "x"}, version=7))
    for w in way_ids[20:25]:  # a node more
        ways[w] = [*ways[w], 9_000_000_001]
    for w in way_ids[25:30]:  # a node less (a way of two or more keeps one)
        ways[w] = ways[w][1:] or ways[w]
    for w in way_ids[30:35]:  # other nodes altogether
        ways[w] = [node_ids[0], node_ids[1]]
    modify += [way_xml(w, ways[w], {"highway": "path"}, version=7) for w in way_ids[20:35]]
    for w in way_ids[35:40]:
        delete.append(way_xml(w, ways.pop(w), {}, version=7))
    ways[9_000_000_002] = [node_ids[2], node_ids[3], 9_000_000_001]
    create.append(way_xml(9_000_000_002, ways[9_000_000_002], {"highway": "path"}, version=1))
    modify.append(relation_xml(rel_ids[0], rels[rel_ids[0]], {"type": "multipolygon", "note": "x"}, version=9))
    rels[rel_ids[1]] = [*rels[rel_ids[1]], ("w", 9_000_000_002, "outer")]
    modify.append(relation_xml(rel_ids[1], rels[rel_ids[1]], {"type": "multipolygon"}, version=9))
    delete.append(relation_xml(rel_ids[2], rels.pop(rel_ids[2]), {}, version=9))
    rels[shrunk] = rels[shrunk][1:]  # a way member less
    modify.append(relation_xml(shrunk, rels[shrunk], {"type": "route"}, version=9))
    delete.append(node_xml(node_ids[9], None, None, version=3))
    del nodes[node_ids[9]]
    diff = read_diff(write_osc(tmp_path / "d.osc", osc(create=create, modify=modify, delete=delete)))
    assert apply_diff(GeometryStore.of_store(store), diff)["applied"] is True

    located = {r["id"]: (r["lon"], r["lat"]) for r in _table(store, "nodes")}
    assert located.keys() == nodes.keys()
    assert max(abs(a - b) for n, at in located.items() for a, b in zip(at, nodes[n], strict=True)) < 1e-7
    stored: dict[int, list[tuple[int, int]]] = {}
    for r in _table(store, "way_nodes"):
        stored.setdefault(r["way_id"], []).append((r["seq"], r["node_id"]))
    assert {w: [n for _, n in sorted(v)] for w, v in stored.items()} == ways
    assert {(r["node_id"], r["way_id"]) for r in _table(store, "node_ways")} == {
        (n, w) for w, refs in ways.items() for n in refs
    }
    members: dict[int, list[tuple[int, str, int, str]]] = {}
    for r in _table(store, "members"):
        members.setdefault(r["rel_id"], []).append((r["seq"], r["member_type"], r["member_id"], r["role"]))
    assert {r: [m[1:] for m in sorted(v)] for r, v in members.items()} == {r: m for r, m in rels.items() if m}
    assert_member_relations(store, rels)
    counts = GeometryStore.of_store(store).manifest().counts
    assert (counts["nodes"], counts["ways"], counts["way_nodes"]) == (
        len(nodes),
        len(ways),
        sum(map(len, ways.values())),
    )
    assert counts["members"] == sum(map(len, rels.values()))


def test_tag_edits_leave_the_geometry_rows_alone(store: Path, extract: Extract, tmp_path: Path) -> None:
    """A diff of tag edits only (the way's node list and the node's location as stored) rewrites no row:
    the database file's pages, once checkpointed, are those of before but for the manifest's. (Each way
    edit used to take its nodes' rows out of the reverse index and put them back: in a big store, a page
    each.)"""
    db = store / "geometry" / "geometry.sqlite"
    before = _pages(db)
    modify = [
        way_xml(w, refs, {**tags, "note": "x"}, version=7) for w, (refs, tags) in list(extract.ways.items())[:200]
    ]
    modify += [
        node_xml(n, lon, lat, {"amenity": "bench"}, version=3) for n, (lon, lat) in list(extract.nodes.items())[:200]
    ]
    diff = read_diff(write_osc(tmp_path / "d.osc", osc(modify=modify)))
    with GeometryStore(store / "geometry", keep_writer=True) as geo:
        assert apply_diff(geo, diff, sequence=None)["applied"] is True
    after = _pages(db)
    changed = sum(1 for old, new in zip(before, after, strict=False) if old != new) + abs(len(after) - len(before))
    assert changed <= 2, f"{changed} of {len(before)} pages changed"


def test_a_way_without_nodes_is_deleted_too(store: Path, tmp_path: Path) -> None:
    """A way the store holds with no nodes (an extract may have one) goes when the diff deletes it."""
    geo = GeometryStore.of_store(store)
    ways_before = geo.manifest().counts["ways"]
    empty = read_diff(write_osc(tmp_path / "1.osc", osc(create=[way_xml(9_000_000_003, [], {}, version=1)])))
    assert apply_diff(geo, empty)["applied"] is True
    with closing(geo.reader()) as conn:
        assert conn.execute("SELECT nodes FROM ways WHERE id = 9000000003").fetchone() == ("[]",)
    assert geo.manifest().counts["ways"] == ways_before + 1
    gone = read_diff(write_osc(tmp_path / "2.osc", osc(delete=[way_xml(9_000_000_003, [], {}, version=2)])))
    assert apply_diff(geo, gone)["applied"] is True
    with closing(geo.reader()) as conn:
        assert conn.execute("SELECT count(*) FROM ways WHERE id = 9000000003").fetchone() == (0,)
    assert geo.manifest().counts["ways"] == ways_before
