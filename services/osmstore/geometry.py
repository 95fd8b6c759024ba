"""The geometry store for tile expiry: node locations and way/relation membership, in SQLite keyed by id.

Layout under ``STORE/geometry/``::

    geometry.sqlite   (WAL)
      nodes(id PRIMARY KEY, lon, lat)
      ways(id PRIMARY KEY, nodes)       nodes: the way's node ids in order, a JSON array
      relations(id PRIMARY KEY, members)  members: [[type, id, role], ...], a JSON array
      node_ways(node_id, way_id)        PRIMARY KEY (node_id, way_id): the reverse index, node -> ways
      node_relations(node_id, rel_id)   PRIMARY KEY (node_id, rel_id): node members -> their relations
      way_relations(way_id, rel_id)     PRIMARY KEY (way_id, rel_id): way members -> their relations
      meta(key PRIMARY KEY, value)      'manifest': sequence, counts, applied diffs, commits (JSON)
    LOCK              flock'ed by whoever applies a diff (one writer per store, across processes)

This is osm2pgsql's "middle" (its slim tables: node locations, and each way's node list and each relation's
members in the object's own row, with the reverse indexes from a node to its ways and from a member to its
relations, which osm2pgsql's middle answers with its ``parts`` array index) on an embedded engine:
every lookup a diff needs is a B-tree probe by id, and applying a diff writes the diff's rows and the pages
holding them, one transaction, so a diff costs what the diff weighs, whatever the size of the store
(docs/decisions.md, "The geometry store at scale"). One row per way and per relation, not per way node and
per member, is what lets the import load them at a row per object (a relation lists ~136 members in the
scaled extract); SQLite's ``json_each`` unpacks the few a diff reads, and builds the reverse indexes in one
statement each. Readers
in other processes (Spark executors at scale, ``store_lookup``) open the file read-only and see the last
committed state; a crash mid-diff leaves the one before (WAL rollback).
"""

from __future__ import annotations

import fcntl
import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from .wal import WAL_SIZE_LIMIT, Checkpointer

GEOMETRY_DIR = "geometry"
GEOMETRY_DB = "geometry.sqlite"
# 1 was the copy-on-write Parquet snapshots, 2 a row per way node and per member, 3 had no member -> relation
# indexes (upgraded in place: ``GeometryStore.locked``).
FORMAT_VERSION = 4
UPGRADABLE_FROM = 3
CACHE_KIB = 64 * 1024  # a connection's page cache: the upper levels of the B-trees stay in memory
# Bytes of a store file a connection reads through a memory map (SQLite caps it at its compile-time maximum:
# 2 GiB in Debian's and Python's builds). A diff's lookups land on pages all over a big store; read from the
# OS page cache through pread each one cost a system call and a copy (docs/performance.md, "The OSM
# stores' design"). Writes still go through SQLite's own pages.
MMAP_BYTES = 1 << 40
APPLIED_KEPT = 100  # digests of the last applied diffs, to recognise a replay of a diff without sequence

SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE nodes (id INTEGER PRIMARY KEY, lon REAL NOT NULL, lat REAL NOT NULL);
CREATE TABLE ways (id INTEGER PRIMARY KEY, nodes TEXT NOT NULL);
CREATE TABLE relations (id INTEGER PRIMARY KEY, members TEXT NOT NULL);
CREATE TABLE node_ways (node_id INTEGER NOT NULL, way_id INTEGER NOT NULL, PRIMARY KEY (node_id, way_id)) WITHOUT ROWID;
"""
# The parents osm2pgsql's dependency manager looks up (docs/spark-bridge.md, "What a change expires"): the
# relations of a node member and of a way member. Relation members are not indexed: osm2pgsql does not
# re-process the parents of a changed relation.
MEMBER_INDEX_SCHEMA = """
CREATE TABLE node_relations (node_id INTEGER NOT NULL, rel_id INTEGER NOT NULL,
                             PRIMARY KEY (node_id, rel_id)) WITHOUT ROWID;
CREATE TABLE way_relations (way_id INTEGER NOT NULL, rel_id INTEGER NOT NULL,
                            PRIMARY KEY (way_id, rel_id)) WITHOUT ROWID;
"""
MEMBER_INDEXES = {"n": "node_relations", "w": "way_relations"}  # member type -> its index
SCHEMA += MEMBER_INDEX_SCHEMA
_IDS = "(SELECT value FROM json_each(?))"  # ids bound as one JSON array (id_list): no SQL built from ids
_WAY_REFS = "SELECT w.id AS way_id, r.key AS seq, r.value AS node_id FROM ways w, json_each(w.nodes) r"


def add_node_ways(conn: sqlite3.Connection) -> None:
    """Index the nodes of every way: in (node, way) order, so the import builds the index with one sort after
    the load, as osm2pgsql builds its indexes. (A diff moves only the pairs its ways gained or lost:
    geometry_apply.)"""
    conn.execute(
        f"INSERT OR IGNORE INTO node_ways (node_id, way_id) SELECT node_id, way_id FROM ({_WAY_REFS}) "  # noqa: S608
        "ORDER BY node_id, way_id"
    )


def add_member_relations(conn: sqlite3.Connection) -> None:
    """Index the node and way members of every relation, in (member, relation) order, as ``add_node_ways``.
    (A diff moves only the pairs its relations gained or lost: geometry_apply.)"""
    for kind, table in MEMBER_INDEXES.items():
        conn.execute(
            f"INSERT OR IGNORE INTO {table} SELECT m.value ->> 1, r.id "  # noqa: S608 - names from a constant
            f"FROM relations r, json_each(r.members) m WHERE m.value ->> 0 = '{kind}' ORDER BY 1, 2"
        )


# What expiry looks up by id (store_lookup): the rows of each lookup, the ids as one JSON array bound to the
# one parameter. Each is a primary key probe per id (the way nodes and members then unpacked from the row).
LOOKUPS: dict[str, tuple[pa.Schema, str]] = {
    "nodes": (
        pa.schema([("id", pa.int64()), ("lon", pa.float64()), ("lat", pa.float64())]),
        f"SELECT id, lon, lat FROM nodes WHERE id IN {_IDS}",  # noqa: S608
    ),
    "way_nodes": (
        pa.schema([("way_id", pa.int64()), ("seq", pa.int64()), ("node_id", pa.int64())]),
        f"SELECT way_id, seq, node_id FROM ({_WAY_REFS}) WHERE way_id IN {_IDS}",  # noqa: S608
    ),
    "node_ways": (
        pa.schema([("node_id", pa.int64()), ("way_id", pa.int64())]),
        f"SELECT node_id, way_id FROM node_ways WHERE node_id IN {_IDS}",  # noqa: S608
    ),
    "members": (
        pa.schema([("rel_id", pa.int64()), ("member_type", pa.string()), ("member_id", pa.int64())]),
        "SELECT r.id, m.value ->> 0, m.value ->> 1 FROM relations r, json_each(r.members) m "  # noqa: S608
        f"WHERE r.id IN {_IDS}",
    ),
    # The relations a node is in, as a member or through a way using it (node -> relation, node -> way ->
    # relation): one lookup, so following a moved node to its relations costs no step of its own.
    "node_relations": (
        pa.schema([("node_id", pa.int64()), ("rel_id", pa.int64())]),
        f"SELECT node_id, rel_id FROM node_relations WHERE node_id IN {_IDS} UNION "  # noqa: S608
        "SELECT nw.node_id, wr.rel_id FROM node_ways nw JOIN way_relations wr ON wr.way_id = nw.way_id "
        f"WHERE nw.node_id IN {_IDS}",
    ),
    "way_relations": (
        pa.schema([("way_id", pa.int64()), ("rel_id", pa.int64())]),
        f"SELECT way_id, rel_id FROM way_relations WHERE way_id IN {_IDS}",  # noqa: S608
    ),
    # The stored refs of the relations' way members (their old lines): a relation's members are mostly ways a
    # regional store lacks (cut at its edge), so they come as the refs of those it has, not as members.
    "relation_way_nodes": (
        pa.schema([("way_id", pa.int64()), ("seq", pa.int64()), ("node_id", pa.int64())]),
        "SELECT w.id, n.key, n.value FROM relations r, json_each(r.members) m "  # noqa: S608
        "JOIN ways w ON w.id = m.value ->> 1, json_each(w.nodes) n "
        f"WHERE r.id IN {_IDS} AND m.value ->> 0 = 'w'",
    ),
}


def id_list(ids: Iterable[int]) -> str:
    """Ids as one JSON array, for ``json_each(?)``."""
    return json.dumps(sorted(int(i) for i in ids))


def lookup(conn: sqlite3.Connection, name: str, ids: Iterable[int]) -> pa.Table:
    """The rows of lookup ``name`` (LOOKUPS) for ``ids``, as Arrow."""
    schema, sql = LOOKUPS[name]
    listed = id_list(ids)
    rows = conn.execute(sql, (listed,) * sql.count(_IDS)).fetchall()
    columns: list[tuple[Any, ...]] = list(zip(*rows, strict=True)) if rows else [() for _ in schema.names]
    return pa.table([pa.array(c, f.type) for c, f in zip(columns, schema, strict=True)], schema=schema)


class GeometryStoreError(Exception):
    """The geometry store is missing or unusable, or a diff cannot be applied to it."""


class SequenceGap(GeometryStoreError):
    """A replication diff that does not follow the store's sequence number."""


@dataclass
class Manifest:
    sequence: int | None
    counts: dict[str, int]
    applied: list[dict[str, Any]] = field(default_factory=list)  # [{"sequence", "sha256"}], newest last
    commits: int = 0  # diffs committed since the import
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(
            {
                "format_version": self.format_version,
                "sequence": self.sequence,
                "counts": self.counts,
                "applied": self.applied[-APPLIED_KEPT:],
                "commits": self.commits,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        version = data.get("format_version")
        if version not in (FORMAT_VERSION, UPGRADABLE_FROM):
            raise GeometryStoreError(f"geometry store format {version!r} is not {FORMAT_VERSION}")
        return cls(
            sequence=data.get("sequence"),
            counts=dict(data["counts"]),
            applied=list(data.get("applied", [])),
            commits=int(data.get("commits", 0)),
            format_version=version,
        )


def write_manifest(conn: sqlite3.Connection, manifest: Manifest) -> None:
    """Within the caller's transaction: the manifest commits with the rows it describes."""
    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('manifest', ?)", (manifest.to_json(),))


def connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    """A connection to a geometry database; read-only ones can never write, whatever a caller does.

    A writer commits without fsync (``synchronous = NORMAL``: in WAL mode a commit appends to the log, and
    only a checkpoint syncs) and never checkpoints by itself (``wal_autocheckpoint = 0``): the checkpoints
    run beside the diffs (Checkpointer), so no diff waits for one. A power cut may lose the last commits,
    never consistency; the expiry job's order recovers that case (store_job: the diff is run again, the
    rendering store recognises its sequence, the expiry is recomputed from the old geometry). Usable from
    any thread (the bridge runs jobs in worker threads; the caller serialises writes with ``locked``)."""
    if readonly:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
    else:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.executescript(
            f"PRAGMA synchronous = NORMAL; PRAGMA wal_autocheckpoint = 0; PRAGMA journal_size_limit = {WAL_SIZE_LIMIT};"
        )
    conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
    conn.execute(f"PRAGMA mmap_size = {MMAP_BYTES}")
    return conn


class GeometryStore:
    """An existing geometry store (``STORE/geometry``): its database, sequence and writer lock."""

    def __init__(self, root: Path, *, keep_writer: bool = False) -> None:
        """``keep_writer``: keep the writer connection open across diffs, with the WAL checkpointed in the
        background (a long-lived process applying diffs: the bridge); ``close`` it at the end. Otherwise
        each ``writer()`` opens a connection and closes it, checkpointing there."""
        self.root = Path(root)
        self.keep_writer = keep_writer
        self.db = self.root / GEOMETRY_DB
        if not self.db.is_file():
            raise GeometryStoreError(
                f"{self.root.parent}: no geometry store (no {GEOMETRY_DIR}/{GEOMETRY_DB}); "
                "import the extract with toposm-import"
            )
        self._writer: sqlite3.Connection | None = None
        self._writer_inode = 0
        self._checkpointer: Checkpointer | None = None
        self._writing = threading.Lock()

    @classmethod
    def of_store(cls, store_dir: Path) -> GeometryStore:
        return cls(Path(store_dir) / GEOMETRY_DIR)

    def reader(self) -> sqlite3.Connection:
        return connect(self.db, readonly=True)

    @contextmanager
    def lookups(self) -> Iterator[sqlite3.Connection]:
        """A connection for a diff's lookups (the caller holds ``locked``): with ``keep_writer`` the kept
        writer, whose cache holds the B-trees' upper levels and the pages recent diffs read; otherwise a
        read-only connection of its own."""
        if not self.keep_writer:
            with closing(self.reader()) as conn:
                yield conn
            return
        with self.writer() as conn:
            yield conn

    @contextmanager
    def writer(self) -> Iterator[sqlite3.Connection]:
        """A writer connection (the caller holds ``locked``). With ``keep_writer`` it stays open across
        diffs, and the WAL is checkpointed in the background after each use (Checkpointer)."""
        if not self.keep_writer:
            with closing(connect(self.db)) as conn:
                yield conn
            return
        with self._writing:
            inode = self.db.stat().st_ino
            if self._writer is not None and inode != self._writer_inode:  # imported again (--replace)
                self._close_writer()
            if self._writer is None:
                self._writer, self._writer_inode = connect(self.db), inode
                self._checkpointer = Checkpointer(self.db)
            try:
                yield self._writer
            finally:
                assert self._checkpointer is not None
                self._checkpointer.poke()

    def close(self) -> None:
        """Stop the checkpoints and close the writer (which checkpoints what is left)."""
        with self._writing:
            self._close_writer()

    def _close_writer(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()
        if self._writer is not None:
            self._writer.close()
        self._writer = self._checkpointer = None

    def __enter__(self) -> GeometryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def manifest(self) -> Manifest:
        try:
            with closing(self.reader()) as conn:
                row = conn.execute("SELECT value FROM meta WHERE key = 'manifest'").fetchone()
            if row is None:
                raise KeyError("manifest")
            return Manifest.from_json(row[0])
        except (sqlite3.Error, ValueError, KeyError, TypeError) as exc:
            raise GeometryStoreError(f"{self.db}: unreadable manifest ({exc})") from exc

    @property
    def sequence(self) -> int | None:
        return self.manifest().sequence

    @contextmanager
    def locked(self) -> Iterator[Manifest]:
        """Hold the writer lock (across processes); yields the manifest as it is under the lock."""
        with (self.root / "LOCK").open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                manifest = self.manifest()
                yield self._upgraded(manifest) if manifest.format_version == UPGRADABLE_FROM else manifest
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _upgraded(self, manifest: Manifest) -> Manifest:
        """A store of the previous format gets its member -> relation indexes (the caller holds the lock), in
        one transaction, so that no store has to be imported again."""
        upgraded = Manifest(
            sequence=manifest.sequence, counts=manifest.counts, applied=manifest.applied, commits=manifest.commits
        )
        with self.writer() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in MEMBER_INDEX_SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                add_member_relations(conn)
                write_manifest(conn, upgraded)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return upgraded
