"""The geometry store (Parquet, for expiry) built by the import pass, and diffs applied to it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from services.osmstore.geometry import GeometryStore, SequenceGap, partition_bits
from services.osmstore.geometry_apply import apply_diff
from services.osmstore.osc_diff import DiffError, read_diff
from tests.osmstore.osm_fixtures import Extract, node_xml, osc, read_extract, way_xml, write_osc


@pytest.fixture(scope="module")
def extract(helsinki: Path) -> Extract:
    return read_extract(helsinki)


def _table(store: Path, name: str) -> list[dict]:
    geo = GeometryStore.of_store(store)
    return ds.dataset(geo.table_dir(name), format="parquet", partitioning="hive").to_table().to_pylist()


def _digest(store: Path) -> str:
    h = hashlib.sha256()
    for name in ("nodes", "way_nodes", "node_ways", "members"):
        rows = sorted(tuple(sorted(r.items())) for r in _table(store, name))
        h.update(repr(rows).encode())
    h.update((store / "geometry" / "CURRENT").read_bytes())
    return h.hexdigest()


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
        r: ms for r, (ms, _) in extract.relations.items() if ms}
    manifest = json.loads((imported_store / "geometry" / "CURRENT").read_text())
    assert manifest["sequence"] is None and manifest["counts"]["nodes"] == len(extract.nodes)


def test_partitions_scale_with_the_extract() -> None:
    city = partition_bits(700_000)
    planet = partition_bits(80 << 30)
    assert city == {"node": 34, "way": 31, "relation": 25}  # one partition per table: ids stay below 2^bits
    assert 2**34 >> planet["node"] >= 2000  # thousands of node partitions for the planet


def test_moved_node_changed_way_deleted_way(store: Path, extract: Extract, tmp_path: Path) -> None:
    (wid, (refs, tags)), (gone, (gone_refs, gone_tags)) = list(extract.ways.items())[:2]
    nid = refs[0]
    lon, lat = extract.nodes[nid]
    text = osc(create=[node_xml(9_000_000_001, 24.95, 60.17, version=1)],
               modify=[node_xml(nid, lon + 0.001, lat), way_xml(wid, [*refs, 9_000_000_001], tags)],
               delete=[way_xml(gone, gone_refs, gone_tags, version=9)])
    stats = apply_diff(GeometryStore.of_store(store), read_diff(write_osc(tmp_path / "d.osc", text)), sequence=None)
    assert stats["applied"] is True
    nodes = {r["id"]: (r["lon"], r["lat"]) for r in _table(store, "nodes")}
    assert nodes[nid] == pytest.approx((lon + 0.001, lat)) and nodes[9_000_000_001] == pytest.approx((24.95, 60.17))
    way_rows = [r for r in _table(store, "way_nodes") if r["way_id"] == wid]
    assert [r["node_id"] for r in sorted(way_rows, key=lambda r: r["seq"])] == [*refs, 9_000_000_001]
    assert not [r for r in _table(store, "way_nodes") if r["way_id"] == gone]
    pairs = {(r["node_id"], r["way_id"]) for r in _table(store, "node_ways")}
    assert (9_000_000_001, wid) in pairs and not {p for p in pairs if p[1] == gone}
    # Only the live snapshot is left.
    assert sorted(p.name for p in (store / "geometry").iterdir() if p.is_dir()) == [stats["snapshot"]]


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
    with pytest.raises(DiffError, match="cut.osc.gz"):
        read_diff(cut)
    assert _digest(store) == before


def test_failure_while_building_leaves_the_live_snapshot(store: Path, extract: Extract, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash between writing partitions and the commit: the store is as before, no leftovers."""
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
    assert [p.name for p in (store / "geometry").iterdir() if p.is_dir()] == ["s000000"]
