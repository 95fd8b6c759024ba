"""apply_osc on a store imported from the real Helsinki extract: each kind of edit, and all-or-nothing."""

from __future__ import annotations

import hashlib
import sqlite3
import struct
from pathlib import Path

import pytest

from harness.osm import Extract, coastline_node, node_xml, osc, read_extract, relation_xml, way_xml, write_osc
from services.osmstore import render_db
from services.osmstore.coastline import refresh_sea
from services.osmstore.render_db import FEATURE_TABLES, INDEX_GRID
from services.osmstore.render_store import RenderStoreError, apply_osc
from services.osmstore.store_diff import apply_to_store
from services.osmstore.wkb import mercator, wkb_bbox
from tests.services.osmstore.conftest import index_entry


@pytest.fixture(scope="module")
def extract(helsinki: Path) -> Extract:
    return read_extract(helsinki)


def _db(store: Path) -> sqlite3.Connection:
    return sqlite3.connect(store / "render.sqlite")


def _bbox(
    db: sqlite3.Connection, table: str, osm_type: str, osm_id: int, grid: float = INDEX_GRID
) -> tuple[float, float, float, float]:
    """The feature's geometry box, once its index entry is checked to be that box rounded out to ``grid``."""
    row = db.execute(
        f"SELECT t.geom, i.xmin, i.ymin, i.xmax, i.ymax FROM {table} t JOIN idx_{table}_geom i "
        f"ON i.pkid = t.fid WHERE t.osm_type = ? AND t.osm_id = ?",
        (osm_type, osm_id),
    ).fetchone()
    assert row is not None, f"{table} has no feature for {osm_type}{osm_id}"
    assert list(row[1:]) == index_entry(row[0], grid), (table, osm_id)
    return wkb_bbox(row[0])


def _street(extract: Extract, name: str) -> tuple[int, list[int], dict[str, str]]:
    for wid, (refs, tags) in extract.ways.items():
        if tags.get("name") == name and tags.get("highway"):
            return wid, refs, tags
    raise AssertionError(f"no street {name} in the extract")


def _complete_building(extract: Extract, used_by_relations: bool = False) -> tuple[int, list[int], dict[str, str]]:
    members = {ref for refs, _ in extract.relations.values() for t, ref, _r in refs if t == "w"}
    for wid, (refs, tags) in sorted(extract.ways.items()):
        if (
            tags.get("building")
            and refs[0] == refs[-1]
            and all(r in extract.nodes for r in refs)
            and (wid in members) == used_by_relations
        ):
            return wid, refs, tags
    raise AssertionError("no complete building in the extract")


def test_renamed_street_shows_its_new_name(store: Path, extract: Extract, tmp_path: Path) -> None:
    wid, refs, tags = _street(extract, "Mikonkatu")
    diff = write_osc(tmp_path / "rename.osc", osc(modify=[way_xml(wid, refs, {**tags, "name": "Qbrokerinkatu"})]))
    stats = apply_osc(store, diff)
    assert stats["ways_modified"] == 1 and stats["ways_rebuilt"] == 1
    db = _db(store)
    assert db.execute("SELECT name FROM roads WHERE osm_type = 'w' AND osm_id = ?", (wid,)).fetchall() == [
        ("Qbrokerinkatu",)
    ]
    assert db.execute("SELECT json_extract(tags, '$.name') FROM ways WHERE id = ?", (wid,)).fetchone()[0] == (
        "Qbrokerinkatu"
    )


def test_moved_node_rebuilds_the_way_not_in_the_diff(store: Path, extract: Extract, tmp_path: Path) -> None:
    wid, refs, _tags = _complete_building(extract)
    db = _db(store)
    before = _bbox(db, "buildings", "w", wid)
    nid = refs[0]
    lon, lat = extract.nodes[nid]
    new_lon, new_lat = lon + 0.002, lat + 0.001  # pulls one corner well outside the old outline
    stats = apply_osc(store, write_osc(tmp_path / "move.osc.gz", osc(modify=[node_xml(nid, new_lon, new_lat)])))
    assert stats["nodes_modified"] == 1 and stats["ways_rebuilt"] >= 1
    after = _bbox(_db(store), "buildings", "w", wid)
    x, y = mercator(new_lon, new_lat)
    assert after != before
    assert after[2] == pytest.approx(max(before[2], x), abs=1.0)
    assert after[3] == pytest.approx(max(before[3], y), abs=1.0)


def test_moved_member_node_rebuilds_the_multipolygon(store: Path, extract: Extract, tmp_path: Path) -> None:
    db = _db(store)
    rel_id = db.execute("SELECT osm_id FROM buildings WHERE osm_type = 'r' ORDER BY osm_id LIMIT 1").fetchone()[0]
    members, _tags = extract.relations[rel_id]
    outer = next(ref for t, ref, role in members if t == "w" and role == "outer")
    nid = extract.ways[outer][0][1]
    lon, lat = extract.nodes[nid]
    before = _bbox(db, "buildings", "r", rel_id)
    stats = apply_osc(store, write_osc(tmp_path / "mp.osc", osc(modify=[node_xml(nid, lon - 0.003, lat)])))
    assert stats["relations_rebuilt"] >= 1
    after = _bbox(_db(store), "buildings", "r", rel_id)
    assert after[0] == pytest.approx(mercator(lon - 0.003, lat)[0], abs=1.0) and after[0] < before[0]


def test_new_building(store: Path, tmp_path: Path) -> None:
    corners = [(24.9440, 60.1700), (24.9444, 60.1700), (24.9444, 60.1702), (24.9440, 60.1702)]
    nodes = [node_xml(9_000_000_001 + i, lon, lat, version=1) for i, (lon, lat) in enumerate(corners)]
    refs = [9_000_000_001 + i for i in range(4)] + [9_000_000_001]
    way = way_xml(9_000_000_100, refs, {"building": "yes", "name": "Qbroker House"}, version=1)
    stats = apply_osc(store, write_osc(tmp_path / "new.osc", osc(create=[*nodes, way])))
    assert stats["nodes_created"] == 4 and stats["ways_created"] == 1
    db = _db(store)
    assert db.execute("SELECT name FROM buildings WHERE osm_id = 9000000100").fetchone() == ("Qbroker House",)
    minx, miny, maxx, maxy = _bbox(db, "buildings", "w", 9_000_000_100)
    assert (minx, miny) == pytest.approx(mercator(24.9440, 60.1700), abs=1.0)
    assert (maxx, maxy) == pytest.approx(mercator(24.9444, 60.1702), abs=1.0)


def test_deleted_way(store: Path, extract: Extract, tmp_path: Path) -> None:
    wid, refs, tags = _street(extract, "Aleksanterinkatu")
    db = _db(store)
    assert db.execute("SELECT count(*) FROM roads WHERE osm_id = ?", (wid,)).fetchone()[0] == 1
    stats = apply_osc(store, write_osc(tmp_path / "del.osc", osc(delete=[way_xml(wid, refs, tags, version=3)])))
    assert stats["ways_deleted"] == 1
    db = _db(store)
    assert db.execute("SELECT count(*) FROM roads WHERE osm_id = ?", (wid,)).fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM ways WHERE id = ?", (wid,)).fetchone()[0] == 0
    assert (
        db.execute("SELECT count(*) FROM roads").fetchone()[0]
        == db.execute("SELECT count(*) FROM idx_roads_geom").fetchone()[0]
    )


def _digest(store: Path) -> str:
    db = _db(store)
    h = hashlib.sha256()
    for table in ("ways", "relations", "relation_members", "roads", "buildings", "idx_buildings_geom", "meta"):
        for row in db.execute(f"SELECT * FROM {table} ORDER BY 1, 2"):
            h.update(repr(row).encode())
    return h.hexdigest()


@pytest.mark.parametrize("compressed", [False, True], ids=["osc", "osc.gz"])
def test_failure_midway_changes_nothing(store: Path, extract: Extract, tmp_path: Path, compressed: bool) -> None:
    """Every node moves, then the file breaks: the moves already read must be rolled back."""
    before = _digest(store)
    moves = [node_xml(nid, lon + 0.001, lat) for nid, (lon, lat) in extract.nodes.items()]
    wid, refs, tags = _street(extract, "Mikonkatu")
    text = osc(modify=[*moves, way_xml(wid, refs, {**tags, "name": "Never"})])
    if compressed:  # a download cut short
        data = write_osc(tmp_path / "full.osc.gz", text).read_bytes()
        diff = tmp_path / "cut.osc.gz"
        diff.write_bytes(data[: len(data) * 3 // 4])
    else:  # a corrupt element after thousands of good ones
        bad = text.replace("</modify>", '<node id="not-a-number" lat="1" lon="1"/></modify>')
        diff = write_osc(tmp_path / "bad.osc", bad)
    with pytest.raises(RenderStoreError, match="the store is unchanged"):
        apply_osc(store, diff)
    assert _digest(store) == before


def test_missing_inputs(store: Path, tmp_path: Path) -> None:
    with pytest.raises(RenderStoreError, match="no such file"):
        apply_osc(store, tmp_path / "nothing.osc")
    with pytest.raises(RenderStoreError, match="not a rendering store"):
        apply_osc(tmp_path, write_osc(tmp_path / "empty.osc", osc()))


def test_a_coastline_edit_marks_the_sea_which_refresh_rebuilds(store: Path, extract: Extract, tmp_path: Path) -> None:
    """The sea is made from the whole coastline, so a diff does not rebuild it (that grew with the store):
    it marks it stale, and refresh_sea rebuilds it, once."""
    nid = coastline_node(extract)
    lon, lat = extract.nodes[nid]
    db = _db(store)
    sea = "SELECT geom FROM water WHERE osm_type = 'c' ORDER BY osm_id"
    before = db.execute(sea).fetchall()
    # Both stores: the sea is rebuilt from the geometry store's node locations.
    stats = apply_to_store(store, write_osc(tmp_path / "coast.osc", osc(modify=[node_xml(nid, lon + 0.001, lat)])))
    stats = stats["render"]
    assert stats["sea_stale"] == 1 and db.execute(sea).fetchall() == before
    assert refresh_sea(store) >= 1
    after = b"".join(g for (g,) in db.execute(sea))
    assert struct.pack("<dd", *mercator(lon + 0.001, lat)) in after  # the moved vertex
    assert struct.pack("<dd", *mercator(lon, lat)) not in after
    assert refresh_sea(store) is None  # no longer stale


def test_the_rendering_store_refuses_a_diff_the_geometry_store_is_not_ready_for(
    store: Path, extract: Extract, tmp_path: Path
) -> None:
    """The rendering store lays a diff over the geometry store's state (the one middle): after a diff applied
    to the rendering store alone, the next is refused, until the geometry store has the first one too."""
    wid, refs, tags = _street(extract, "Mikonkatu")
    first = write_osc(tmp_path / "one.osc", osc(modify=[way_xml(wid, refs, {**tags, "name": "Yksi"}, version=5)]))
    second = write_osc(tmp_path / "two.osc", osc(modify=[way_xml(wid, refs, {**tags, "name": "Kaksi"}, version=6)]))
    assert apply_osc(store, first, sequence=1)["ways_modified"] == 1
    with pytest.raises(RenderStoreError, match="geometry store has 0 diffs applied and the rendering store 1"):
        apply_osc(store, second, sequence=2)
    done = apply_to_store(store, first, sequence=1)  # the rendering store skips it, the geometry store catches up
    assert done["render"] == {"skipped": 1} and done["geometry"]["applied"] is True
    assert apply_to_store(store, second, sequence=2)["render"]["ways_modified"] == 1
    assert _db(store).execute("SELECT name FROM roads WHERE osm_id = ?", (wid,)).fetchone() == ("Kaksi",)


def test_a_store_without_its_geometry_store_is_refused(store: Path, tmp_path: Path) -> None:
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "render.sqlite").write_bytes((store / "render.sqlite").read_bytes())
    with pytest.raises(RenderStoreError, match="no geometry store beside the rendering store"):
        apply_osc(lone, write_osc(tmp_path / "empty.osc", osc()))


def test_byte_identical_replication_diffs_are_applied_to_both_stores(store: Path, tmp_path: Path) -> None:
    """Two empty minutes make the same bytes: each is the next sequence, applied to both stores, which stay
    in step (the rendering store used to skip the second by its digest while the geometry store applied it)."""
    empty = write_osc(tmp_path / "empty.osc", osc())
    for sequence in (1, 2):
        done = apply_to_store(store, empty, sequence=sequence)
        assert done["render"].get("skipped") is None and done["geometry"]["applied"] is True
    assert _db(store).execute("SELECT value FROM meta WHERE key = 'diffs_applied'").fetchone() == ("2",)


def _index_pages(db: sqlite3.Connection) -> dict[str, list[tuple[int, bytes]]]:
    """Every R*Tree node of every feature table, as stored."""
    return {
        table: db.execute(f"SELECT nodeno, data FROM idx_{table}_geom_node ORDER BY nodeno").fetchall()
        for table in FEATURE_TABLES
    }


def test_a_node_moved_inside_its_ways_box_rewrites_the_row_and_leaves_the_index(
    store: Path, extract: Extract, tmp_path: Path
) -> None:
    """A rebuilt feature made differently keeps its row (new values in place) and, when its box is the same,
    its R*Tree entry: the index is byte for byte as it was, and a tile query still finds the road."""
    ways_of: dict[int, int] = {}
    for refs, _tags in extract.ways.values():
        for ref in set(refs):
            ways_of[ref] = ways_of.get(ref, 0) + 1
    db = _db(store)
    for wid, (refs, tags) in sorted(extract.ways.items()):
        if not tags.get("highway") or len(refs) < 4 or not all(r in extract.nodes for r in refs):
            continue
        for nid in refs[1:-1]:
            others = [extract.nodes[r] for r in refs if r != nid]
            lon, lat = extract.nodes[nid]
            inside = min(o[0] for o in others) < lon < max(o[0] for o in others) and min(
                o[1] for o in others
            ) < lat < max(o[1] for o in others)
            drawn = any(
                db.execute(f"SELECT 1 FROM {t} WHERE osm_type = 'n' AND osm_id = ?", (nid,)).fetchone()
                for t in FEATURE_TABLES
            )
            if inside and ways_of[nid] == 1 and refs.count(nid) == 1 and not drawn:
                break
        else:
            continue
        break
    else:
        raise AssertionError("no road with a node inside its box in the extract")
    fid, geom = db.execute("SELECT fid, geom FROM roads WHERE osm_type = 'w' AND osm_id = ?", (wid,)).fetchone()
    box, index = _bbox(db, "roads", "w", wid), _index_pages(db)
    db.close()

    stats = apply_osc(store, write_osc(tmp_path / "nudge.osc", osc(modify=[node_xml(nid, lon + 1e-7, lat - 1e-7)])))
    assert stats["ways_rebuilt"] == 1 and stats["features_rewritten"] == 1 and stats["features_removed"] == 0
    db = _db(store)
    assert db.execute("SELECT fid FROM roads WHERE osm_type = 'w' AND osm_id = ?", (wid,)).fetchall() == [(fid,)]
    assert db.execute("SELECT geom FROM roads WHERE fid = ?", (fid,)).fetchone()[0] != geom
    assert _bbox(db, "roads", "w", wid) == box and _index_pages(db) == index
    x, y = mercator(lon, lat)
    assert (
        db.execute(
            "SELECT pkid FROM idx_roads_geom WHERE xmin <= ? AND xmax >= ? AND ymin <= ? AND ymax >= ?", (x, x, y, y)
        )
        .fetchall()
        .count((fid,))
        == 1
    )


def _new_building(store: Path, tmp_path: Path) -> tuple[float, float]:
    """A new building whose east side lies mid-cell of the index grid; returns its north-east corner."""
    lon = 24.9444
    while not 0.3 < mercator(lon, 60.17)[0] / INDEX_GRID % 1 < 0.7:
        lon += 1e-4
    corners = [(24.9440, 60.1700), (lon, 60.1700), (lon, 60.1702), (24.9440, 60.1702)]
    nodes = [node_xml(9_000_000_001 + i, x, y, version=1) for i, (x, y) in enumerate(corners)]
    way = way_xml(9_000_000_100, [*range(9_000_000_001, 9_000_000_005), 9_000_000_001], {"building": "yes"}, version=1)
    apply_to_store(store, write_osc(tmp_path / "new.osc", osc(create=[*nodes, way])))
    return lon, 60.1702


def test_a_move_within_the_index_grid_leaves_the_index(store: Path, tmp_path: Path) -> None:
    """A corner moved ~1 m east changes the building's box but not its index box (rounded out to the grid):
    the R*Tree is byte for byte as it was. Moved 100 m, the index box follows it."""
    lon, lat = _new_building(store, tmp_path)
    db = _db(store)
    box, index = _bbox(db, "buildings", "w", 9_000_000_100), _index_pages(db)
    db.close()
    nudge = write_osc(tmp_path / "nudge.osc", osc(modify=[node_xml(9_000_000_003, lon + 1e-5, lat)]))
    stats = apply_to_store(store, nudge)["render"]
    assert stats["features_rewritten"] == 1
    db = _db(store)
    moved = _bbox(db, "buildings", "w", 9_000_000_100)
    assert moved[2] == pytest.approx(box[2] + 1.11, abs=0.01) and _index_pages(db) == index
    db.close()
    apply_to_store(store, write_osc(tmp_path / "far.osc", osc(modify=[node_xml(9_000_000_003, lon + 1e-3, lat)])))
    db = _db(store)
    assert _bbox(db, "buildings", "w", 9_000_000_100)[2] == pytest.approx(box[2] + 111.3, abs=0.1)
    assert _index_pages(db) != index and db.execute("SELECT rtreecheck('idx_buildings_geom')").fetchone() == ("ok",)


def test_a_store_imported_before_the_index_grid_keeps_exact_boxes(store: Path, tmp_path: Path) -> None:
    """A store without ``index_grid`` in its meta was indexed with exact boxes: a diff keeps to them (a box
    rounded out there would be compared with an exact one and left wrong)."""
    db = _db(store)
    db.execute("DELETE FROM meta WHERE key = 'index_grid'")
    db.commit()
    db.close()
    lon, lat = _new_building(store, tmp_path)
    _bbox(_db(store), "buildings", "w", 9_000_000_100, grid=0)
    apply_to_store(store, write_osc(tmp_path / "nudge.osc", osc(modify=[node_xml(9_000_000_003, lon + 1e-5, lat)])))
    _bbox(_db(store), "buildings", "w", 9_000_000_100, grid=0)


def test_ways_and_relations_modified_as_stored_write_no_row(store: Path, extract: Extract, tmp_path: Path) -> None:
    """A way and a multipolygon modified with the tags, nodes and members they have (a new version that
    changed nothing drawn) change no row: the same row changes as an empty diff's (its meta). Retagged,
    they do."""
    wid, refs, tags = _street(extract, "Aleksanterinkatu")
    rel_id = _db(store).execute("SELECT osm_id FROM buildings WHERE osm_type = 'r' ORDER BY osm_id").fetchone()[0]
    members, rel_tags = extract.relations[rel_id]

    def changes(name: str, modify: list[str]) -> int:  # rows the diff changes, rolled back
        conn = render_db.connect(store / render_db.RENDER_DB)
        apply_osc(store, write_osc(tmp_path / name, osc(modify=modify)), connection=conn, commit_if=lambda: False)
        changed = conn.total_changes
        conn.close()
        return changed

    empty = changes("empty.osc", [])
    same = [way_xml(wid, refs, tags, version=99), relation_xml(rel_id, members, rel_tags, 99)]
    assert changes("same.osc", same) == empty
    assert changes("way.osc", [way_xml(wid, refs, {**tags, "note": "x"}, version=99)]) > empty
    assert changes("relation.osc", [relation_xml(rel_id, members[:-1], rel_tags, 99)]) > empty
