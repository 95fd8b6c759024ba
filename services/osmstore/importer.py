"""``toposm-import EXTRACT.osm.pbf --store DIR``: build the stores for one OSM extract.

The import writes ``DIR/render.sqlite`` (the rendering store Mapnik reads) and ``DIR/geometry/`` (the geometry
store for expiry, ``services.osmstore.geometry``), the way osm2pgsql imports: libosmium reads the file in C++
(``import_pass``: node locations into an on-disk index, ways and relations out as OPL, areas assembled), the
rows go into SQLite in bulk and the indexes are built after them, and the two stores are built in parallel
processes where the machine has more than one core; the geometry store is the middle of both (render_db).
Each step works on a block of objects, not the extract (docs/decisions.md; peak memory is flat beyond the
node index, docs/performance.md). Everything is built in a temporary directory beside DIR and renamed into
place at the end, so a corrupt or non-OSM input leaves nothing half-built behind.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import osmium
import pyarrow.compute as pc
from pydantic import model_validator

from qbroker.exit_codes import ExitCode
from qbroker.settings import option
from services.toposm.settings import StackSettings, stack_option

from . import render_db
from .bulk_sqlite import analyze, bulk_load_settings, insert_columns
from .coastline import write_sea
from .errors import ImportFailed
from .geometry import GEOMETRY_DIR
from .geometry_import import GeometryBuild, build_geometry_store
from .import_pass import PassResult, read_extract
from .line_features import write_line_features
from .node_locations import NodeLocations
from .opl_columns import Relations, Ways, distinct_tags, opl_tags, read_objects
from .progress import ImportProgress
from .render_cluster import BulkFeatureWriter
from .tags import relation_makes_area
from .wkb import Coord, mercator_arrays

__all__ = ["ImportFailed", "import_extract", "main"]


STORE_JSON = "store.json"
SCRATCH = ".scratch"  # the pass's index and OPL files, inside the directory being built


def _tags_json(raw: str) -> str:
    return render_db.tags_json(opl_tags(raw))


def _insert_area_members(conn: sqlite3.Connection, relations: Relations) -> None:
    """The members of the relations that can make an area: all a diff update of the rendering store looks up
    (render_store: which multipolygons use a changed way). The geometry store keeps every relation's; here
    the others (routes, boundaries...) were most of the rows and of the index on them, for nothing."""
    areas = np.array(distinct_tags(relations.tags, lambda raw: relation_makes_area(opl_tags(raw))), dtype=bool)
    if not areas.any():
        return
    insert_columns(
        conn,
        "INSERT OR REPLACE INTO relation_members (relation_id, seq, member_type, member_id, role)",
        relations.member_rows(areas),
    )


def _coastline_refs(ways: Ways) -> dict[int, list[int]]:
    """The node lists of the ``natural=coastline`` ways among ``ways`` by way id: what the sea is made of."""
    maybe = pc.match_substring(ways.tags, "natural=coastline").to_numpy(zero_copy_only=False)
    return {
        int(ways.ids[i]): ways.refs[ways.offsets[i] : ways.offsets[i + 1]].tolist()
        for i in np.flatnonzero(maybe).tolist()
        if opl_tags(ways.tags[i].as_py()).get("natural") == "coastline"
    }


def _mercator_points(locations: NodeLocations, ids: list[int]) -> dict[int, Coord]:
    wanted = np.array(ids, dtype=np.int64)
    located = locations.locate(wanted)
    ok = located.valid
    x, y = mercator_arrays(located.lon[ok], located.lat[ok])
    return dict(zip(wanted[ok].tolist(), zip(x.tolist(), y.tolist(), strict=True), strict=True))


def _load_render_tables(
    conn: sqlite3.Connection,
    scan: PassResult,
    writer: BulkFeatureWriter,
    progress: ImportProgress,
    coastline: dict[int, list[int]],
) -> dict[str, int]:
    """The rendering store's OSM tables and line features, from the pass's files; returns the object counts
    and adds the coastline ways' node lists to ``coastline``. Node locations and way node lists go to the
    geometry store only (the one middle, render_db)."""
    counts = {"nodes": scan.locations.count, "ways": 0, "relations": 0}
    progress.add("nodes", scan.locations.count)
    for batch in read_objects(scan.objects):
        ids = batch.ids.tolist()
        if isinstance(batch, Ways):
            insert_columns(conn, "INSERT OR REPLACE INTO ways (id, tags)", [ids, distinct_tags(batch.tags, _tags_json)])
            write_line_features(batch, scan.locations, writer)
            coastline.update(_coastline_refs(batch))
            kind = "ways"
        else:
            insert_columns(
                conn, "INSERT OR REPLACE INTO relations (id, tags)", [ids, distinct_tags(batch.tags, _tags_json)]
            )
            _insert_area_members(conn, batch)
            kind = "relations"
        counts[kind] += len(batch)
        progress.add(kind, len(batch))
    writer.flush()
    return counts


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _header(extract: Path) -> tuple[int | None, list[float] | None]:
    """The replication sequence number and the bounding box (west, south, east, north) the header declares."""
    reader = osmium.io.Reader(str(extract), osmium.osm.osm_entity_bits.NOTHING)
    try:
        header = reader.header()
        value = header.get("osmosis_replication_sequence_number", "")
        box = header.box()
        bbox = [box.bottom_left.lon, box.bottom_left.lat, box.top_right.lon, box.top_right.lat] if box.valid() else None
    finally:
        reader.close()
    return (int(value) if value.isdigit() else None), bbox


def _build(extract: Path, work: Path, progress: ImportProgress) -> dict[str, Any]:
    conn = render_db.connect(work / render_db.RENDER_DB)
    bulk_load_settings(conn)  # a failed import throws the whole directory away
    render_db.create_schema(conn)
    conn.execute("BEGIN")
    writer = BulkFeatureWriter(conn)
    try:
        scan = read_extract(extract, work / SCRATCH, writer)
    except (RuntimeError, ValueError) as exc:  # what libosmium raises on corrupt or non-OSM input
        raise ImportFailed(f"{extract}: not a readable OSM file ({exc})") from exc
    sequence, header_bbox = _header(extract)
    geometry_args = (work / GEOMETRY_DIR, scan.locations.path, scan.locations.count, scan.objects, sequence)
    # The geometry store is built by a second process while this one builds the rendering store; on one core,
    # after it.
    geometry = GeometryBuild(*geometry_args) if _cores() > 1 else None
    try:
        scan.areas.write_spilled(scan.spilled_areas)  # before the ways' features, in the order of the pass
        coastline: dict[int, list[int]] = {}
        counts = _load_render_tables(conn, scan, writer, progress, coastline)
        if sum(counts.values()) == 0:
            raise ImportFailed(f"{extract}: holds no OSM nodes, ways or relations")
        if sequence is not None:
            render_db.set_meta(conn, "sequence", str(sequence))
        # The extract's box bounds the sea: coastlines are closed along it (the nodes' box if no header says).
        extent = header_bbox or scan.locations.bounds() or [180.0, 90.0, -180.0, -90.0]
        render_db.set_meta(conn, "extent", json.dumps(extent))
        # In way id order, as refresh_sea reads them from the stores.
        write_sea(
            conn, writer, [coastline[i] for i in sorted(coastline)], lambda ids: _mercator_points(scan.locations, ids)
        )
        writer.finish()  # the features in space order: renders read neighbours on disk (render_cluster)
        render_db.create_indexes(conn)
        conn.execute("COMMIT")
        feature_counts = render_db.feature_counts(conn)
        analyze(conn)
        conn.close()
        geometry_counts = geometry.result() if geometry is not None else build_geometry_store(*geometry_args)
    except BaseException:
        if geometry is not None:
            geometry.stop()
        raise
    shutil.rmtree(work / SCRATCH, ignore_errors=True)
    west, south, east, north = extent
    return {
        "format_version": render_db.FORMAT_VERSION,
        "source": str(extract.resolve()),
        "source_size": extract.stat().st_size,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "bbox": [west, south, east, north],
        "srs": "EPSG:3857",
        "sequence": sequence,
        "counts": counts,
        "features": feature_counts,
        "geometry": geometry_counts,
        "attribution": "© OpenStreetMap contributors (ODbL 1.0)",
    }


def import_extract(
    extract: Path, store: Path, *, replace: bool = False, progress: ImportProgress | None = None
) -> dict[str, Any]:
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


class ImportSettings(StackSettings):
    prog = "toposm-import"
    description = __doc__.split("\n\n")[0]

    extract: Path = option(
        help="an OpenStreetMap extract (.osm.pbf, .osm, .osm.bz2)", positional=True, metavar="EXTRACT"
    )
    store: Path | None = stack_option("store", help="directory of the embedded stores (render.sqlite, geometry/)")
    postgis: str | None = stack_option(
        "postgis", help="import with osm2pgsql into this PostGIS database instead of --store"
    )
    replace: bool = option(False, "rebuild --store if it already exists")
    flat_nodes: Path | None = stack_option(
        "flat_nodes", help="with --postgis: keep node locations in this osm2pgsql flat-nodes file (countries, planet)"
    )

    @model_validator(mode="after")
    def _one_target(self) -> ImportSettings:
        if (self.store is None) == (self.postgis is None):
            raise ValueError("one of --store DIR and --postgis DSN is needed")
        if self.flat_nodes is not None and not self.postgis:
            raise ValueError("--flat-nodes goes with --postgis")
        return self


def main(argv: list[str] | None = None) -> None:
    a = ImportSettings.parse(argv)
    try:
        if a.postgis:
            from .postgis import import_postgis

            import_postgis(a.extract, a.postgis, flat_nodes=a.flat_nodes)
            from .style_layers import connection_params

            where = connection_params(a.postgis).get("dbname", "the database")  # not the DSN: it may hold a password
            print(f"imported {a.extract} into PostGIS database {where}", file=sys.stderr)
            return
        assert a.store is not None  # one target (ImportSettings)
        with ImportProgress(enabled=sys.stderr.isatty()) as progress:
            info = import_extract(a.extract, a.store, replace=a.replace, progress=progress)
    except ImportFailed as exc:
        print(f"toposm-import: {exc}", file=sys.stderr)
        raise SystemExit(int(ExitCode.ERROR)) from None
    counts = info["counts"]
    rate = sum(counts.values()) / max(info["seconds"], 1e-6)
    print(
        f"imported {a.extract} into {a.store}: {counts['nodes']} nodes, {counts['ways']} ways, "
        f"{counts['relations']} relations in {info['seconds']:.1f}s ({rate:,.0f} objects/s); "
        f"features {info['features']}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
