"""``toposm-import EXTRACT.osm.pbf --store DIR``: build the stores for one OSM extract in one pyosmium pass.

The pass writes ``DIR/render.sqlite`` (the rendering store Mapnik reads) and ``DIR/geometry/`` (the geometry
store for expiry, ``services.osmstore.geometry``). pyosmium reads the relations first
(its multipolygon assembler needs them before the ways) and then streams the file once, handing each object to
both writers. Everything is built in a temporary directory beside DIR and renamed into place at the end, so a
corrupt or non-OSM input leaves nothing half-built behind.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import osmium

from . import render_db
from .coastline import rebuild_sea
from .errors import ImportFailed
from .features import FeatureExtractor
from .geometry import GEOMETRY_DIR, GeometryStoreWriter
from .progress import ImportProgress

__all__ = ["ImportFailed", "import_extract", "main"]


STORE_JSON = "store.json"
_FLUSH = 20_000


class _ImportHandler(osmium.SimpleHandler):
    def __init__(self, conn: Any, geometry: Any, progress: ImportProgress) -> None:
        super().__init__()
        self.conn = conn
        self.features = FeatureExtractor(render_db.FeatureWriter(conn))
        self.geometry = geometry
        self.progress = progress
        self.counts = {"nodes": 0, "ways": 0, "relations": 0}
        self.bounds = [180.0, 90.0, -180.0, -90.0]
        self._nodes: list[tuple[int, float, float]] = []
        self._way_nodes: list[tuple[int, int, int]] = []
        self._ways: list[tuple[int, str]] = []

    def node(self, n: osmium.osm.Node) -> None:
        loc = n.location
        if loc.valid():
            lon, lat = loc.lon, loc.lat
            self._nodes.append((n.id, lon, lat))
            b = self.bounds
            if lon < b[0]:
                b[0] = lon
            if lat < b[1]:
                b[1] = lat
            if lon > b[2]:
                b[2] = lon
            if lat > b[3]:
                b[3] = lat
            if len(self._nodes) >= _FLUSH:
                self._flush()
        self.features.node(n)
        if self.geometry is not None:
            self.geometry.node(n)
        self.counts["nodes"] += 1
        self.progress.tick("nodes")

    def way(self, w: osmium.osm.Way) -> None:
        self._ways.append((w.id, render_db.tags_json((t.k, t.v) for t in w.tags)))
        self._way_nodes.extend((w.id, i, ref.ref) for i, ref in enumerate(w.nodes))
        if len(self._way_nodes) >= _FLUSH:
            self._flush()
        self.features.way(w)
        if self.geometry is not None:
            self.geometry.way(w)
        self.counts["ways"] += 1
        self.progress.tick("ways")

    def relation(self, r: osmium.osm.Relation) -> None:
        self.conn.execute("INSERT INTO relations (id, tags) VALUES (?, ?)",
                          (r.id, render_db.tags_json((t.k, t.v) for t in r.tags)))
        self.conn.executemany(
            "INSERT INTO relation_members (relation_id, seq, member_type, member_id, role) VALUES (?, ?, ?, ?, ?)",
            [(r.id, i, m.type, m.ref, m.role) for i, m in enumerate(r.members)])
        if self.geometry is not None:
            self.geometry.relation(r)
        self.counts["relations"] += 1
        self.progress.tick("relations")

    def area(self, a: osmium.osm.Area) -> None:
        self.features.area(a)

    def _flush(self) -> None:
        self.conn.executemany("INSERT INTO nodes (id, lon, lat) VALUES (?, ?, ?)", self._nodes)
        self.conn.executemany("INSERT INTO ways (id, tags) VALUES (?, ?)", self._ways)
        self.conn.executemany("INSERT INTO way_nodes (way_id, seq, node_id) VALUES (?, ?, ?)", self._way_nodes)
        self._nodes, self._ways, self._way_nodes = [], [], []

    def finish(self) -> None:
        self._flush()


def _header(extract: Path) -> tuple[int | None, list[float] | None]:
    """The replication sequence number and the bounding box (west, south, east, north) the header declares."""
    reader = osmium.io.Reader(str(extract), osmium.osm.osm_entity_bits.NOTHING)
    try:
        header = reader.header()
        value = header.get("osmosis_replication_sequence_number", "")
        box = header.box()
        bbox = ([box.bottom_left.lon, box.bottom_left.lat, box.top_right.lon, box.top_right.lat]
                if box.valid() else None)
    finally:
        reader.close()
    return (int(value) if value.isdigit() else None), bbox


def _build(extract: Path, work: Path, progress: ImportProgress) -> dict[str, Any]:
    conn = render_db.connect(work / render_db.RENDER_DB)
    conn.execute("PRAGMA journal_mode = OFF")  # a failed import throws the whole directory away
    conn.execute("PRAGMA synchronous = OFF")
    render_db.create_schema(conn)
    geometry = GeometryStoreWriter(work / GEOMETRY_DIR)
    handler = _ImportHandler(conn, geometry, progress)
    conn.execute("BEGIN")
    try:
        handler.apply_file(str(extract), locations=True)
    except (RuntimeError, ValueError) as exc:  # what libosmium raises on corrupt or non-OSM input
        raise ImportFailed(f"{extract}: not a readable OSM file ({exc})") from exc
    handler.finish()
    render_db.create_indexes(conn)
    sequence, header_bbox = _header(extract)
    if sequence is not None:
        render_db.set_meta(conn, "sequence", str(sequence))
    # The extract's box bounds the sea: coastlines are closed along it (the nodes' box if no header says).
    extent = header_bbox or handler.bounds
    render_db.set_meta(conn, "extent", json.dumps(extent))
    rebuild_sea(conn, handler.features.writer)
    conn.execute("COMMIT")
    features = render_db.feature_counts(conn)
    conn.execute("ANALYZE")
    conn.close()
    if sum(handler.counts.values()) == 0:
        raise ImportFailed(f"{extract}: holds no OSM nodes, ways or relations")
    geometry_counts = geometry.close(sequence)
    west, south, east, north = extent
    return {
        "format_version": render_db.FORMAT_VERSION,
        "source": str(extract.resolve()),
        "source_size": extract.stat().st_size,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "bbox": [west, south, east, north],
        "srs": "EPSG:3857",
        "sequence": sequence,
        "counts": handler.counts,
        "features": features,
        "geometry": geometry_counts,
        "attribution": "© OpenStreetMap contributors (ODbL 1.0)",
    }


def import_extract(extract: Path, store: Path, *, replace: bool = False,
                   progress: ImportProgress | None = None) -> dict[str, Any]:
    """Build ``store`` from ``extract``; returns what ``store.json`` says. Raises ImportFailed."""
    if not extract.is_file():
        raise ImportFailed(f"{extract}: no such file")
    if store.exists() and any(store.iterdir()) and not replace:
        raise ImportFailed(f"{store}: exists and is not empty (pass --replace to rebuild it)")
    store.parent.mkdir(parents=True, exist_ok=True)
    work = store.parent / f".{store.name}.importing"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        started = time.monotonic()
        info = _build(extract, work, progress or ImportProgress(enabled=False))
        info["seconds"] = round(time.monotonic() - started, 3)
        (work / STORE_JSON).write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n")
        old = store.parent / f".{store.name}.old"
        if store.exists():
            store.rename(old)
        work.rename(store)
        shutil.rmtree(old, ignore_errors=True)
        return info
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="toposm-import", description=__doc__.split("\n\n")[0])
    p.add_argument("extract", type=Path, help="an OpenStreetMap extract (.osm.pbf, .osm, .osm.bz2)")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--store", type=Path, help="directory of the embedded stores (render.sqlite, geometry/)")
    target.add_argument("--postgis", metavar="DSN", help="import with osm2pgsql into this PostGIS database instead")
    p.add_argument("--replace", action="store_true", help="rebuild --store if it already exists")
    p.add_argument("--flat-nodes", type=Path, metavar="FILE",
                   help="with --postgis: keep node locations in this osm2pgsql flat-nodes file (countries, planet)")
    a = p.parse_args(argv)
    if a.flat_nodes is not None and not a.postgis:
        p.error("--flat-nodes goes with --postgis")
    try:
        if a.postgis:
            from .postgis import import_postgis

            import_postgis(a.extract, a.postgis, flat_nodes=a.flat_nodes)
            from .style_layers import connection_params

            where = connection_params(a.postgis).get("dbname", "the database")  # not the DSN: it may hold a password
            print(f"imported {a.extract} into PostGIS database {where}", file=sys.stderr)
            return
        with ImportProgress(enabled=sys.stderr.isatty()) as progress:
            info = import_extract(a.extract, a.store, replace=a.replace, progress=progress)
    except ImportFailed as exc:
        print(f"toposm-import: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    counts = info["counts"]
    rate = sum(counts.values()) / max(info["seconds"], 1e-6)
    print(f"imported {a.extract} into {a.store}: {counts['nodes']} nodes, {counts['ways']} ways, "
          f"{counts['relations']} relations in {info['seconds']:.1f}s ({rate:,.0f} objects/s); "
          f"features {info['features']}", file=sys.stderr)


if __name__ == "__main__":
    main()
