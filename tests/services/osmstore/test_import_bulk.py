"""The bulk import (libosmium's pass, Arrow columns, numpy geometry) against the per-object code diff updates
use, on the real extract; and its memory: node locations in a file, the OPL read a block at a time."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import osmium

from services.osmstore import render_db
from services.osmstore.area_features import AreaFeatures, area_tags
from services.osmstore.features import FeatureExtractor
from services.osmstore.import_pass import read_extract
from services.osmstore.opl_columns import Relations, Ways, read_objects
from services.osmstore.render_cluster import BulkFeatureWriter
from services.osmstore.tags import area_features, relation_makes_area


class _PerObject(osmium.SimpleHandler):
    def __init__(self, features: FeatureExtractor) -> None:
        super().__init__()
        self.features = features

    def node(self, n: osmium.osm.Node) -> None:
        self.features.node(n)

    def way(self, w: osmium.osm.Way) -> None:
        self.features.way(w)

    def area(self, a: osmium.osm.Area) -> None:
        self.features.area(a)


def _features(db: sqlite3.Connection, table: str) -> list[tuple[object, ...]]:
    cols = ", ".join(f't."{c}"' for c in render_db.FEATURE_TABLES[table])
    return sorted(
        db.execute(
            f"SELECT t.osm_type, t.osm_id, {cols}, t.geom, i.xmin, i.xmax, i.ymin, i.ymax FROM {table} t "  # noqa: S608
            f"JOIN idx_{table}_geom i ON i.pkid = t.fid WHERE t.osm_type != 'c'"
        ).fetchall(),
        key=repr,
    )


def test_import_equals_the_per_object_code(imported_store: Path, helsinki: Path, tmp_path: Path) -> None:
    reference = render_db.connect(tmp_path / "reference.sqlite")
    render_db.create_schema(reference)
    _PerObject(FeatureExtractor(render_db.FeatureWriter(reference))).apply_file(str(helsinki), locations=True)
    imported = sqlite3.connect(imported_store / "render.sqlite")
    for table in render_db.FEATURE_TABLES:
        expected = _features(reference, table)
        assert _features(imported, table) == expected, table  # same rows, same WKB bytes, same boxes
    assert len(_features(imported, "buildings")) > 400 and len(_features(imported, "roads")) > 2000
    tags, refs, area_members = {}, {}, []
    for obj in osmium.FileProcessor(str(helsinki), osmium.osm.WAY | osmium.osm.RELATION):
        if obj.is_way():
            tags[obj.id] = render_db.tags_json((t.k, t.v) for t in obj.tags)
            refs[obj.id] = [n.ref for n in obj.nodes]
        elif relation_makes_area({t.k: t.v for t in obj.tags}):
            area_members += [(obj.id, i, m.type, m.ref, m.role) for i, m in enumerate(obj.members)]
    assert dict(imported.execute("SELECT id, tags FROM ways")) == tags  # OPL escapes decoded (names, spaces)
    geometry = sqlite3.connect(imported_store / "geometry" / "geometry.sqlite")
    stored = {way_id: json.loads(nodes) for way_id, nodes in geometry.execute("SELECT id, nodes FROM ways")}
    assert stored == refs
    assert imported.execute("SELECT * FROM relation_members ORDER BY 1, 2").fetchall() == area_members


def test_node_locations_on_disk_and_objects_read_a_block_at_a_time(helsinki: Path, tmp_path: Path) -> None:
    conn = sqlite3.connect(":memory:")
    render_db.create_schema(conn)
    scan = read_extract(helsinki, tmp_path / "scratch", BulkFeatureWriter(conn))
    # Node locations live in libosmium's index file, mapped, not in the heap; read back exactly.
    assert isinstance(scan.locations.records, np.memmap)
    assert scan.locations.path.stat().st_size >= 16 * scan.locations.count
    expected = {n.id: (n.location.lon, n.location.lat) for n in osmium.FileProcessor(str(helsinki), osmium.osm.NODE)}
    assert scan.locations.count == len(expected)
    ids = np.array(sorted(expected), dtype=np.int64)
    located = scan.locations.locate(np.concatenate([ids, [ids[-1] + 1]]))
    assert list(zip(located.lon[:-1].tolist(), located.lat[:-1].tolist(), strict=True)) == [expected[i] for i in ids]
    assert np.isnan(located.lon[-1])  # a ref the extract lacks has no location
    # The ways and relations come a block of text at a time: a smaller block, smaller batches, the same rows.
    whole = list(read_objects(scan.objects))
    small = list(read_objects(scan.objects, block_size=64 * 1024))
    assert len(small) > 2 * len(whole)
    assert max(len(b) for b in small) < max(len(b) for b in whole)
    for kind in (Ways, Relations):
        got = [i for b in small if isinstance(b, kind) for i in b.ids.tolist()]
        assert got == [i for b in whole if isinstance(b, kind) for i in b.ids.tolist()]
    # The geometry store's counts, from the text alone (tags not read) and from split columns, agree; also
    # for a selection (the counts read the column's character data at once, offsets and all).
    bare = list(read_objects(scan.objects, block_size=64 * 1024, tags=False))
    assert sum(b.ref_count() for b in bare if isinstance(b, Ways)) == sum(
        len(b.refs) for b in whole if isinstance(b, Ways)
    )
    assert sum(b.member_count() for b in bare if isinstance(b, Relations)) == sum(
        len(b.member_ids) for b in whole if isinstance(b, Relations)
    )
    relations = next(b for b in whole if isinstance(b, Relations) and len(b) > 2)
    odd = relations.select(np.arange(len(relations)) % 2 == 1)
    assert (
        odd.member_count()
        == len(odd.member_ids)
        == sum(np.diff(relations.offsets)[np.arange(len(relations)) % 2 == 1].tolist())
    )
    assert all(b.tags.null_count == len(b) for b in bare)


class _TagList:
    """What area_tags uses of pyosmium's TagList: lookups by key and the tags in order."""

    def __init__(self, *pairs: tuple[str, str]) -> None:
        self.pairs = pairs

    def get(self, key: str, default: None = None) -> str | None:
        return dict(self.pairs).get(key, default)

    def __iter__(self) -> Iterator[osmium.osm.Tag]:
        return iter(osmium.osm.Tag(k, v) for k, v in self.pairs)


def test_area_tags_decide_as_the_whole_tag_list() -> None:
    """area_tags looks up only the keys area_features reads; the features are those of all the tags, also
    where two tags could make the landuse feature (the first in the object's order wins)."""
    cases = [
        _TagList(("building", "yes"), ("name", "Talo"), ("addr:housenumber", "5"), ("roof:shape", "flat")),
        _TagList(("leisure", "park"), ("landuse", "grass"), ("name", "Puisto")),
        _TagList(("landuse", "grass"), ("leisure", "park")),
        _TagList(("natural", "water"), ("water", "pond"), ("landuse", "grass")),
        _TagList(("highway", "pedestrian"), ("area", "yes")),
    ]
    for tags in cases:
        assert area_features(area_tags(tags)) == area_features(dict(tags.pairs)), tags.pairs
    assert area_features(area_tags(cases[1]))[0][1]["kind"] == "park"
    assert area_features(area_tags(cases[2]))[0][1]["kind"] == "grass"


class _Recorder(render_db.FeatureWriter):
    def __init__(self) -> None:
        conn = sqlite3.connect(":memory:")
        render_db.create_schema(conn)
        super().__init__(conn)
        self.rows: list[tuple[object, ...]] = []

    def add(
        self,
        table: str,
        osm_type: str,
        osm_id: int,
        attrs: dict[str, object],
        geom: bytes,
        bbox: tuple[float, float, float, float],
    ) -> None:
        self.rows.append((table, osm_type, osm_id, attrs, geom, bbox))


def test_areas_spilled_during_the_pass_are_written_as_without(helsinki: Path, tmp_path: Path) -> None:
    """The pass spills the areas' batches to a file and writes their features after it: the same rows, in
    the same order, as writing each batch at once (several batches, names with any character included)."""
    direct, later = _Recorder(), _Recorder()
    spilled = tmp_path / "areas.spill"
    with spilled.open("wb") as spill:
        at_once, deferred = AreaFeatures(direct, batch=100), AreaFeatures(later, batch=100, spill=spill)
        for area in (
            osmium.FileProcessor(str(helsinki)).with_areas().with_filter(osmium.filter.EntityFilter(osmium.osm.AREA))
        ):
            at_once.add(area)
            deferred.add(area)
        at_once.flush()
        deferred.flush()
    assert later.rows == []
    AreaFeatures(later).write_spilled(spilled)
    assert len(direct.rows) > 500 and any(isinstance(r[3].get("name"), str) for r in direct.rows)
    assert later.rows == direct.rows
