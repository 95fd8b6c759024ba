"""toposm-import on the real Helsinki extract: counts, layers, the store description, and failures."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections import Counter
from pathlib import Path

import osmium
import pytest

from harness.osm import ROOT
from services.osmstore.importer import ImportFailed, import_extract


def _independent_counts(path: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    for obj in osmium.FileProcessor(str(path)):
        counts[obj.type_str()] += 1
    return counts


def test_counts_match_pyosmium(imported_store: Path, helsinki: Path) -> None:
    expected = _independent_counts(helsinki)
    info = json.loads((imported_store / "store.json").read_text())
    assert info["counts"] == {"nodes": expected["n"], "ways": expected["w"], "relations": expected["r"]}
    db = sqlite3.connect(imported_store / "render.sqlite")
    assert db.execute("SELECT count(*) FROM ways").fetchone()[0] == expected["w"]
    assert db.execute("SELECT count(*) FROM relations").fetchone()[0] == expected["r"]
    # One middle: node locations and way node lists are the geometry store's only.
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "nodes" not in tables and "way_nodes" not in tables
    geometry = sqlite3.connect(imported_store / "geometry" / "geometry.sqlite")
    assert geometry.execute("SELECT count(*) FROM nodes").fetchone()[0] == expected["n"]
    assert info["format_version"] == 2 and info["srs"] == "EPSG:3857"
    assert info["source"] == str(helsinki.resolve())
    west, south, east, north = info["bbox"]
    assert 24.93 < west < east < 24.96 and 60.16 < south < north < 60.18  # central Helsinki
    assert "OpenStreetMap contributors" in info["attribution"]


def test_layers_hold_what_the_extract_has(imported_store: Path, helsinki: Path) -> None:
    named_roads, buildings, places, node_ids = set(), 0, set(), set()
    for obj in osmium.FileProcessor(str(helsinki)):  # nodes come first in the file
        if obj.is_node():
            node_ids.add(obj.id)
        if obj.is_way() and obj.tags.get("highway") in ("primary", "secondary", "tertiary", "residential"):
            named_roads.add(obj.tags.get("name"))
        if obj.is_way() and obj.tags.get("building") and obj.nodes[0].ref == obj.nodes[-1].ref:
            # a building cut by the extract's edge (nodes missing) cannot be drawn, as in osm2pgsql
            buildings += all(n.ref in node_ids for n in obj.nodes)
        if obj.is_node() and obj.tags.get("place") and obj.tags.get("name"):
            places.add(obj.tags["name"])
    db = sqlite3.connect(imported_store / "render.sqlite")
    stored_roads = {r[0] for r in db.execute("SELECT DISTINCT name FROM roads")}
    assert named_roads - {None} <= stored_roads
    assert {r[0] for r in db.execute("SELECT name FROM places")} == places
    assert db.execute("SELECT count(*) FROM buildings WHERE osm_type = 'w'").fetchone()[0] == buildings
    assert db.execute("SELECT count(*) FROM buildings WHERE osm_type = 'r'").fetchone()[0] > 0  # multipolygons
    for table in ("roads", "railways", "water", "landuse", "buildings", "places"):
        rows = db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        indexed = db.execute(f"SELECT count(*) FROM idx_{table}_geom").fetchone()[0]
        assert rows > 0 and rows == indexed, table
    classes = {r[0] for r in db.execute("SELECT DISTINCT class FROM roads")}
    assert {"primary", "secondary", "tertiary", "minor", "path"} <= classes


def _assert_no_leftovers(parent: Path, name: str) -> None:
    assert not (parent / name).exists()
    assert [p.name for p in parent.iterdir() if p.name.startswith(f".{name}")] == []


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("bad.osm.pbf", b"this is not an OSM file\n" * 100),
        ("bad.osm.pbf", b""),
        ("bad.osm", b'<osm version="0.6"><node id="1" lat="60.1" lon="24.9"/><node id="x" lat="1" lon="1"/></osm>'),
        ("bad.osm", b"<html><body>404 Not Found</body></html>"),
    ],
    ids=["text", "empty", "bad-xml-id", "html"],
)
def test_non_osm_file_is_a_clear_error(tmp_path: Path, name: str, content: bytes) -> None:
    bad = tmp_path / name
    bad.write_bytes(content)
    with pytest.raises(ImportFailed, match=name):
        import_extract(bad, tmp_path / "store")
    _assert_no_leftovers(tmp_path, "store")


def test_truncated_extract_leaves_no_store(tmp_path: Path, helsinki: Path) -> None:
    cut = tmp_path / "cut.osm.pbf"
    cut.write_bytes(helsinki.read_bytes()[:400_000])
    with pytest.raises(ImportFailed, match="not a readable OSM file"):
        import_extract(cut, tmp_path / "store")
    _assert_no_leftovers(tmp_path, "store")


def test_failed_reimport_keeps_the_old_store(store: Path, tmp_path: Path) -> None:
    before = (store / "render.sqlite").read_bytes()
    bad = tmp_path / "bad.osm.pbf"
    bad.write_bytes(b"\x00\x00\x00\x0dgarbage" * 50)
    with pytest.raises(ImportFailed):
        import_extract(bad, store, replace=True)
    assert (store / "render.sqlite").read_bytes() == before
    with pytest.raises(ImportFailed, match="--replace"):
        import_extract(bad, store)


def test_cli(tmp_path: Path, helsinki: Path) -> None:
    out = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "toposm-import"), str(helsinki), "--store", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "nodes" in out.stderr and "objects/s" in out.stderr
    assert (tmp_path / "s" / "render.sqlite").is_file()
    bad = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "toposm-import"), str(tmp_path / "missing.pbf"), "--store", str(tmp_path / "t")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1 and "missing.pbf: no such file" in bad.stderr


def test_same_pass_builds_the_geometry_store(imported_store: Path) -> None:
    """The import's one pass also builds the geometry store (the expiry side's SQLite store, the middle of both
    stores: services/osmstore/geometry.py) and records its row counts in store.json."""
    info = json.loads((imported_store / "store.json").read_text())
    assert (imported_store / "geometry").is_dir()
    assert info["geometry"] and all(isinstance(v, int) for v in info["geometry"].values())


def test_progress_on_a_terminal(tmp_path: Path, helsinki: Path) -> None:
    import io

    from rich.console import Console

    from services.osmstore.progress import ImportProgress

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with ImportProgress(enabled=True, console=console) as progress:
        import_extract(helsinki, tmp_path / "s", progress=progress)
    text = out.getvalue()
    assert "24,260" in text and "5,130" in text and "per second" in text
