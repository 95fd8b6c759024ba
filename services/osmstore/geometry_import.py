"""Build the geometry store (``services.osmstore.geometry``) from the import's read of the extract.

Runs in a process of its own beside the rendering store's build (``importer``, through ``start``: a new
interpreter running this module, not multiprocessing, which would re-import the caller's main script), from
the same two files the
C++ pass left: the node location index and the OPL of the ways and relations. Rows go in in key order, many
per statement, without journal or syncs (the directory is thrown away on failure), a way's nodes and a
relation's members as one JSON text made from the OPL in C (``opl_columns``); the reverse indexes (node ->
ways, node and way members -> relations) are built once they are in, by SQLite from the ways and relations,
with one sort each, as osm2pgsql builds its indexes after the load.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from .bulk_sqlite import analyze, bulk_load_settings, insert_columns
from .geometry import GEOMETRY_DB, SCHEMA, Manifest, add_member_relations, add_node_ways, write_manifest
from .node_locations import NodeLocations
from .opl_columns import Ways, read_objects


def build_geometry_store(
    root: Path, locations_file: Path, node_count: int, objects: Path, sequence: int | None
) -> dict[str, int]:
    """Write ``root/geometry.sqlite``; returns its row counts (store.json's ``geometry``)."""
    root.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(root / GEOMETRY_DB, isolation_level=None)
    try:
        bulk_load_settings(conn)
        conn.executescript(SCHEMA)
        counts = dict.fromkeys(("nodes", "ways", "way_nodes", "relations", "members"), 0)
        conn.execute("BEGIN")
        # OR REPLACE: an extract holds each object once, but one listed twice must not fail the import.
        for ids, lon, lat in NodeLocations(locations_file, node_count).batches():
            counts["nodes"] += insert_columns(
                conn, "INSERT OR REPLACE INTO nodes (id, lon, lat)", [ids.tolist(), lon.tolist(), lat.tolist()]
            )
        for batch in read_objects(objects, tags=False):
            ids = batch.ids.tolist()
            if isinstance(batch, Ways):
                counts["ways"] += insert_columns(
                    conn, "INSERT OR REPLACE INTO ways (id, nodes)", [ids, batch.nodes_json().to_pylist()]
                )
                counts["way_nodes"] += batch.ref_count()
            else:
                counts["relations"] += insert_columns(
                    conn, "INSERT OR REPLACE INTO relations (id, members)", [ids, batch.members_json().to_pylist()]
                )
                counts["members"] += batch.member_count()
        add_node_ways(conn)
        add_member_relations(conn)
        write_manifest(conn, Manifest(sequence=sequence, counts=dict(counts)))
        conn.execute("COMMIT")
        analyze(conn)
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA journal_mode = WAL")  # from here on: atomic diffs, readers beside the writer
    finally:
        conn.close()
    return counts


_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding services/: the child imports this code


class GeometryBuild:
    """``build_geometry_store`` running in a child process; ``result`` waits for its counts."""

    def __init__(self, root: Path, locations_file: Path, node_count: int, objects: Path, sequence: int | None) -> None:
        args = json.dumps([str(root), str(locations_file), node_count, str(objects), sequence])
        path = os.pathsep.join(p for p in (str(_PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": path},
        )

    def result(self) -> dict[str, int]:
        out, err = self.process.communicate()
        if self.process.returncode != 0:
            raise RuntimeError(f"building the geometry store failed: {err.strip().splitlines()[-1:] or 'killed'}")
        counts: dict[str, int] = json.loads(out)
        return counts

    def stop(self) -> None:
        """On an error elsewhere: end the child and wait, so nothing writes into a directory being removed."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()


if __name__ == "__main__":
    root, locations_file, node_count, objects, sequence = json.loads(sys.argv[1])
    print(json.dumps(build_geometry_store(Path(root), Path(locations_file), node_count, Path(objects), sequence)))
