"""A diff that changes the same objects several times: applied at once, it must leave the store as its
steps applied one diff each. apply_osc reads the stored state of the diff's objects up front (locations,
which ways and relations exist, which feature tables hold their features) and keeps it in step as it
goes; a step that saw stale state would leave a feature behind or miss one. Each diff goes to both stores
(``apply_to_store``): the rendering store reads the middle (locations, way node lists) in the geometry
store, which must hold the state before each diff."""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
from pathlib import Path

import pytest

from harness.osm import node_xml, osc_blocks, way_xml
from services.osmstore.features import FeatureExtractor
from services.osmstore.osc_diff import read_diff
from services.osmstore.render_db import FEATURE_TABLES, FeatureWriter
from services.osmstore.render_store import _DiffApplier
from services.osmstore.store_diff import apply_to_store

_COUNTERS = ("nodes_created", "nodes_modified", "nodes_deleted", "ways_created", "ways_modified", "ways_deleted")


def _db(store: Path) -> sqlite3.Connection:
    """The rendering store, with the geometry store (the middle) attached as ``g``."""
    db = sqlite3.connect(store / "render.sqlite")
    db.execute("ATTACH DATABASE ? AS g", (str(store / "geometry" / "geometry.sqlite"),))
    return db


def _refs(db: sqlite3.Connection, way: int) -> list[int]:
    return [
        r
        for (r,) in db.execute(
            "SELECT r.value FROM g.ways w, json_each(w.nodes) r WHERE w.id = ? ORDER BY r.key", (way,)
        )
    ]


def _contents(store: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every OSM row, and every feature with its index box but not its fid (which depends on how the
    inserts were grouped into diffs)."""
    db = _db(store)
    out = {
        t: db.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall()  # noqa: S608
        for t in ("g.nodes", "g.ways", "g.relations", "g.node_ways", "ways", "relations", "relation_members")
    }
    for table, columns in FEATURE_TABLES.items():
        cols = ", ".join(f't."{c}"' for c in columns)
        out[table] = sorted(
            db.execute(
                f"SELECT t.osm_type, t.osm_id, {cols}, t.geom, i.xmin, i.xmax, i.ymin, i.ymax "  # noqa: S608
                f"FROM {table} t JOIN idx_{table}_geom i ON i.pkid = t.fid"
            ).fetchall(),
            key=repr,
        )
        assert db.execute(f"SELECT count(*) FROM idx_{table}_geom").fetchone()[0] == len(out[table])  # noqa: S608
    return out


def _osc(blocks: list[tuple[str, str]]) -> str:
    """One object per block, in this order (a merged diff repeats actions)."""
    return osc_blocks((action, [item]) for action, item in blocks)


def test_repeated_objects_in_one_diff_end_as_in_separate_diffs(imported_store: Path, tmp_path: Path) -> None:
    db = _db(imported_store)
    place, lon, lat = db.execute(
        "SELECT p.osm_id, n.lon, n.lat FROM places p JOIN g.nodes n ON n.id = p.osm_id "
        "WHERE p.osm_type = 'n' ORDER BY p.osm_id LIMIT 1"
    ).fetchone()
    street, tags_text = db.execute(
        "SELECT w.id, w.tags FROM roads r JOIN ways w ON w.id = r.osm_id WHERE r.osm_type = 'w' ORDER BY w.id LIMIT 1"
    ).fetchone()
    refs = _refs(db, street)
    moved = refs[len(refs) // 2]
    mlon, mlat = db.execute("SELECT lon, lat FROM g.nodes WHERE id = ?", (moved,)).fetchone()
    db.close()
    tags = {"highway": "residential", "name": "Toistokatu"}
    blocks = [
        ("modify", node_xml(place, lon + 1e-4, lat, {"place": "suburb", "name": "Eka"}, version=10)),
        ("delete", f'<node id="{place}" version="11"/>'),
        ("create", node_xml(place, lon, lat + 1e-4, {"place": "suburb", "name": "Toka"}, version=12)),
        ("modify", node_xml(moved, mlon + 2e-4, mlat, version=10)),
        ("delete", f'<way id="{street}" version="10"/>'),
        ("create", way_xml(street, refs, tags, version=11)),
        ("modify", node_xml(moved, mlon, mlat, version=11)),
        ("modify", way_xml(street, refs[:-1], {**tags, "name": "Kolmas"}, version=12)),
    ]
    assert "Toistokatu" not in tags_text

    at_once = tmp_path / "at-once"
    shutil.copytree(imported_store, at_once)
    path = tmp_path / "all.osc"
    path.write_text(_osc(blocks))
    stats = apply_to_store(at_once, path)["render"]

    stepwise = tmp_path / "stepwise"
    shutil.copytree(imported_store, stepwise)
    totals = dict.fromkeys(_COUNTERS, 0)
    for i, block in enumerate(blocks):
        step = tmp_path / f"step{i}.osc"
        step.write_text(_osc([block]))
        for key, value in apply_to_store(stepwise, step)["render"].items():
            if key in totals:
                totals[key] += value

    assert _contents(at_once) == _contents(stepwise)
    # Only each object's highest version is applied (here also its last), so the counters are those of
    # the steps that carry them.
    winners = tmp_path / "winners"
    shutil.copytree(imported_store, winners)
    expected = dict.fromkeys(_COUNTERS, 0)
    for i in (2, 6, 7):  # place v12, moved v11, street v12
        step = tmp_path / f"winner{i}.osc"
        step.write_text(_osc([blocks[i]]))
        for key, value in apply_to_store(winners, step)["render"].items():
            if key in expected:
                expected[key] += value
    assert {k: stats.get(k, 0) for k in _COUNTERS} == expected
    assert _contents(winners) == _contents(at_once)
    assert totals["nodes_modified"] > expected["nodes_modified"]  # the stepwise run did apply every version
    names = _db(at_once).execute("SELECT name FROM places WHERE osm_type = 'n' AND osm_id = ?", (place,)).fetchall()
    assert names == [("Toka",)]
    roads = _db(at_once).execute("SELECT name FROM roads WHERE osm_type = 'w' AND osm_id = ?", (street,)).fetchall()
    assert roads == [("Kolmas",)]


def test_highest_version_wins_whatever_the_order_in_the_file(imported_store: Path, tmp_path: Path) -> None:
    """A merged diff may list an object's versions out of order: the rendering store keeps the highest, as
    the geometry store does (``read_diff``), not the last one in the file."""
    db = _db(imported_store)
    place, lon, lat = db.execute(
        "SELECT p.osm_id, n.lon, n.lat FROM places p JOIN g.nodes n ON n.id = p.osm_id "
        "WHERE p.osm_type = 'n' ORDER BY p.osm_id LIMIT 1"
    ).fetchone()
    (street,) = db.execute(
        "SELECT w.id FROM roads r JOIN ways w ON w.id = r.osm_id WHERE r.osm_type = 'w' ORDER BY w.id LIMIT 1"
    ).fetchone()
    refs = _refs(db, street)
    db.close()
    tags = {"highway": "residential"}
    blocks = [
        ("modify", node_xml(place, lon, lat, {"place": "suburb", "name": "Uusin"}, version=21)),
        ("modify", node_xml(place, lon + 1e-4, lat, {"place": "suburb", "name": "Vanha"}, version=20)),
        ("modify", way_xml(street, refs, {**tags, "name": "Uusin tie"}, version=31)),
        ("delete", f'<way id="{street}" version="30"/>'),
    ]
    path = tmp_path / "merged.osc"
    path.write_text(_osc(blocks))
    diff = read_diff(path)
    assert diff.nodes[place].version == 21 and diff.ways[street].version == 31 and not diff.ways[street].deleted

    at_once = tmp_path / "at-once"
    shutil.copytree(imported_store, at_once)
    apply_to_store(at_once, path)
    db = _db(at_once)
    location = db.execute("SELECT lon, lat FROM g.nodes WHERE id = ?", (place,)).fetchone()
    assert location == pytest.approx((lon, lat), abs=1e-7)
    assert db.execute("SELECT name FROM places WHERE osm_type = 'n' AND osm_id = ?", (place,)).fetchall() == [
        ("Uusin",)
    ]
    assert db.execute("SELECT name FROM roads WHERE osm_type = 'w' AND osm_id = ?", (street,)).fetchall() == [
        ("Uusin tie",)
    ]
    db.close()

    highest_only = tmp_path / "highest-only"
    shutil.copytree(imported_store, highest_only)
    path.write_text(_osc([blocks[0], blocks[2]]))
    apply_to_store(highest_only, path)
    assert _contents(at_once) == _contents(highest_only)


def _moves_and_ways(store: Path, rng: random.Random, moved: int) -> tuple[list[str], list[tuple[int, str, str]]]:
    """``moved`` of the store's nodes moved by up to ~30 m (as XML), and every way as (id, tags, node list)."""
    db = _db(store)
    nodes = db.execute("SELECT id, lon, lat FROM g.nodes ORDER BY id").fetchall()
    ways = db.execute("SELECT w.id, w.tags, g.nodes FROM ways w JOIN g.ways g ON g.id = w.id ORDER BY w.id").fetchall()
    db.close()
    return [
        node_xml(nid, lon + rng.uniform(-3e-4, 3e-4), lat + rng.uniform(-3e-4, 3e-4), version=50)
        for nid, lon, lat in rng.sample(nodes, moved)
    ], ways


def test_lines_made_without_the_rebuild_file_equal_those_made_through_it(
    imported_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rebuilt ways that can make lines only are drawn from their nodes' locations in Python, the others
    through the small file libosmium assembles areas from: every feature as the file alone made them. A
    diff moving nodes of roads, buildings, landuse and multipolygon members and retagging ways of each kind."""
    rng = random.Random(22)
    moves, ways = _moves_and_ways(imported_store, rng, 400)
    edits = [
        way_xml(wid, json.loads(refs), {**json.loads(tags), "note": "retagged"}, version=50)
        for wid, tags, refs in rng.sample(ways, 150)
    ]
    path = tmp_path / "diff.osc"
    path.write_text(osc_blocks([("modify", moves + edits)]))

    made_here: list[int] = []
    line = FeatureExtractor.line

    def counted(self: FeatureExtractor, way_id: int, *args: object) -> None:
        made_here.append(way_id)
        line(self, way_id, *args)  # type: ignore[arg-type]

    direct = tmp_path / "direct"
    shutil.copytree(imported_store, direct)
    with monkeypatch.context() as patched:
        patched.setattr(FeatureExtractor, "line", counted)
        apply_to_store(direct, path)
    through_file = tmp_path / "through-file"
    shutil.copytree(imported_store, through_file)
    with monkeypatch.context() as patched:
        patched.setattr(_DiffApplier, "_lines_only", lambda self, *args: set())
        apply_to_store(through_file, path)

    assert _contents(direct) == _contents(through_file)
    assert len(set(made_here)) > 200  # many rebuilt ways went without the file
    rebuilt_areas = (
        _db(direct)
        .execute(
            "SELECT count(*) FROM buildings b JOIN ways w ON w.id = b.osm_id "
            "WHERE b.osm_type = 'w' AND w.tags LIKE '%retagged%'"
        )
        .fetchone()[0]
    )
    assert rebuilt_areas > 0  # and areas still came through it


def test_features_made_again_as_they_were_are_kept(
    imported_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rebuilt features that come out as stored (a way retagged with a tag nothing draws) keep their rows;
    the others are replaced: the store ends as when every rebuilt feature was deleted and inserted again.
    A diff of node moves, retags that change nothing drawn and renames."""
    rng = random.Random(7)
    moves, ways = _moves_and_ways(imported_store, rng, 200)
    picked = rng.sample(ways, 300)
    edits = [
        way_xml(wid, json.loads(refs), {**json.loads(tags), "note": "retagged"}, version=50)
        for wid, tags, refs in picked[:200]
    ]
    edits += [
        way_xml(wid, json.loads(refs), {**json.loads(tags), "name": f"Renamed {wid}"}, version=50)
        for wid, tags, refs in picked[200:]
    ]
    path = tmp_path / "diff.osc"
    path.write_text(osc_blocks([("modify", moves + edits)]))

    kept = tmp_path / "kept"
    shutil.copytree(imported_store, kept)
    stats = apply_to_store(kept, path)["render"]
    replaced = tmp_path / "replaced"
    shutil.copytree(imported_store, replaced)
    with monkeypatch.context() as patched:  # every staged feature deleted at once, as before
        patched.setattr(
            FeatureWriter, "stage_many", lambda self, osm_type, ids: [self.remove(osm_type, i) for i in ids] and None
        )
        replaced_stats = apply_to_store(replaced, path)["render"]

    assert _contents(kept) == _contents(replaced)
    assert stats["features_kept"] > 100 and replaced_stats["features_kept"] == 0
    assert stats["features_written"] + stats["features_kept"] == replaced_stats["features_written"]
