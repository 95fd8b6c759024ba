"""The geometry store for tile expiry: node locations and way/relation membership as partitioned Parquet.

Layout under ``STORE/geometry/``::

    CURRENT                        JSON manifest: the live snapshot, replication sequence, applied diffs
    LOCK                           flock'ed by whoever applies a diff (one writer per store)
    s000003/nodes/bucket=B/*.parquet       id, lon, lat                      B = id >> bits[node]
    s000003/way_nodes/bucket=B/*.parquet   way_id, seq, node_id              B = way_id >> bits[way]
    s000003/node_ways/bucket=B/*.parquet   node_id, way_id (reverse index)   B = node_id >> bits[node]
    s000003/members/bucket=B/*.parquet     rel_id, seq, member_type, member_id, role   B = rel_id >> bits[relation]

Partitions are id ranges (Hive ``bucket=`` directories) so that Spark's joins against a few changed
objects read only the partitions those ids fall in (dynamic partition pruning on ``bucket``), whatever the
size of the whole table; files are sorted by their key so Parquet row-group statistics skip the rest.
``node_ways`` is the reverse of ``way_nodes`` (osm2pgsql keeps the same index): "which ways use this
moved node" is then a pruned lookup rather than a scan of every way.

A snapshot is never changed once ``CURRENT`` names it. Applying a diff (``geometry_apply``) builds the next
snapshot beside it (untouched partitions hard-linked, touched ones rewritten) and then replaces
``CURRENT`` atomically: a reader or a crash sees the old state or the new one, never a mix.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import osmium
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

GEOMETRY_DIR = "geometry"
CURRENT = "CURRENT"
FORMAT_VERSION = 1
# Partitions are id ranges of 2^bits ids. The bits are chosen per store at import from the extract's size
# (about one partition per 32 MB of PBF), so a city extract is one partition per table and the planet
# (~80 GB, node ids below 2^34) about 2,500 partitions of a few million nodes each.
BYTES_PER_PARTITION = 32 << 20
ID_SPACE_BITS = {"node": 34, "way": 31, "relation": 25}  # ids below 2^bits today, with headroom
MIN_BITS = {"node": 20, "way": 16, "relation": 10}
APPLIED_KEPT = 100  # digests of the last applied diffs, to recognise a replay of a diff without sequence
_FLUSH_ROWS = 500_000

SCHEMAS: dict[str, pa.Schema] = {
    "nodes": pa.schema([("id", pa.int64()), ("lon", pa.float64()), ("lat", pa.float64())]),
    "way_nodes": pa.schema([("way_id", pa.int64()), ("seq", pa.int32()), ("node_id", pa.int64())]),
    "node_ways": pa.schema([("node_id", pa.int64()), ("way_id", pa.int64())]),
    "members": pa.schema([("rel_id", pa.int64()), ("seq", pa.int32()), ("member_type", pa.string()),
                          ("member_id", pa.int64()), ("role", pa.string())]),
}
# table -> (partition key column, which id space it partitions, sort columns)
PARTITIONING: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "nodes": ("id", "node", ("id",)),
    "way_nodes": ("way_id", "way", ("way_id", "seq")),
    "node_ways": ("node_id", "node", ("node_id", "way_id")),
    "members": ("rel_id", "relation", ("rel_id", "seq")),
}


def partition_bits(extract_bytes: int) -> dict[str, int]:
    """Bits per id space for an extract of this size (see BYTES_PER_PARTITION)."""
    target = max(1, extract_bytes // BYTES_PER_PARTITION)
    spread = max(0, target.bit_length() - 1)  # log2 of the partition count, rounded down
    return {kind: max(MIN_BITS[kind], ID_SPACE_BITS[kind] - spread) for kind in ID_SPACE_BITS}


def table_bits(name: str, bits: dict[str, int]) -> int:
    return bits[PARTITIONING[name][1]]


class GeometryStoreError(Exception):
    """The geometry store is missing or unusable, or a diff cannot be applied to it."""


class SequenceGap(GeometryStoreError):
    """A replication diff that does not follow the store's sequence number."""


def bucket_of(value: int, bits: int) -> int:
    return value >> bits


def bucket_dir(table_dir: Path, bucket: int) -> Path:
    return table_dir / f"bucket={bucket}"


def write_partitioned(table_dir: Path, table: pa.Table, name: str, part: str, bits: int) -> set[int]:
    """Write ``table`` (rows of ``name``) sorted, one file per bucket; returns the buckets written."""
    key, _space, sort = PARTITIONING[name]
    if table.num_rows == 0:
        return set()
    buckets = pc.shift_right(table[key], pa.scalar(bits, pa.int64()))
    table = table.append_column("_bucket", buckets).sort_by([("_bucket", "ascending")]
                                                            + [(c, "ascending") for c in sort])
    values = table["_bucket"].to_numpy()
    cuts = [0, *(i for i in range(1, len(values)) if values[i] != values[i - 1]), len(values)]
    written = set()
    for start, end in zip(cuts, cuts[1:], strict=False):
        bucket = int(values[start])
        target = bucket_dir(table_dir, bucket)
        target.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.slice(start, end - start).drop_columns(["_bucket"]), target / f"part-{part}.parquet")
        written.add(bucket)
    return written


def write_empty(table_dir: Path, name: str) -> None:
    """Spark needs one file to learn a table's schema: an empty table keeps an empty file in bucket 0."""
    target = bucket_dir(table_dir, 0)
    target.mkdir(parents=True, exist_ok=True)
    pq.write_table(SCHEMAS[name].empty_table(), target / "part-empty.parquet")


def has_files(table_dir: Path) -> bool:
    return any(table_dir.glob("bucket=*/*.parquet"))


@dataclass
class Manifest:
    snapshot: str
    sequence: int | None
    counts: dict[str, int]
    bits: dict[str, int]  # id space -> partition bits (partition_bits)
    applied: list[dict[str, Any]] = field(default_factory=list)  # [{"sequence", "sha256"}], newest last
    format_version: int = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        return {"format_version": self.format_version, "snapshot": self.snapshot, "sequence": self.sequence,
                "counts": self.counts, "applied": self.applied[-APPLIED_KEPT:],
                "partition_bits": self.bits}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        if data.get("format_version") != FORMAT_VERSION:
            raise GeometryStoreError(f"geometry store format {data.get('format_version')!r} is not {FORMAT_VERSION}")
        bits = {k: int(v) for k, v in data["partition_bits"].items()}
        if set(bits) != set(ID_SPACE_BITS):
            raise GeometryStoreError(f"geometry store partition_bits {sorted(bits)} are not {sorted(ID_SPACE_BITS)}")
        return cls(snapshot=str(data["snapshot"]), sequence=data.get("sequence"), counts=dict(data["counts"]),
                   bits=bits, applied=list(data.get("applied", [])))


def write_manifest(root: Path, manifest: Manifest) -> None:
    """Replace CURRENT atomically (write, fsync, rename): the commit point of an import or a diff."""
    tmp = root / (CURRENT + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        json.dump(manifest.to_json(), fh, indent=2)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, root / CURRENT)
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself is durable
    finally:
        os.close(fd)


class GeometryStore:
    """An existing geometry store (``STORE/geometry``): its live snapshot, sequence and writer lock."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        if not (self.root / CURRENT).is_file():
            raise GeometryStoreError(f"{self.root.parent}: no geometry store (no {GEOMETRY_DIR}/{CURRENT}); "
                                     "import the extract with toposm-import")

    @classmethod
    def of_store(cls, store_dir: Path) -> GeometryStore:
        return cls(Path(store_dir) / GEOMETRY_DIR)

    def manifest(self) -> Manifest:
        try:
            return Manifest.from_json(json.loads((self.root / CURRENT).read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise GeometryStoreError(f"{self.root / CURRENT}: unreadable manifest ({exc})") from exc

    @property
    def sequence(self) -> int | None:
        return self.manifest().sequence

    def table_dir(self, name: str, manifest: Manifest | None = None) -> Path:
        return self.root / (manifest or self.manifest()).snapshot / name

    @contextmanager
    def locked(self) -> Iterator[Manifest]:
        """Hold the writer lock (across processes); yields the manifest as it is under the lock."""
        with (self.root / "LOCK").open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                manifest = self.manifest()
                self._remove_stale(manifest)
                yield manifest
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _remove_stale(self, manifest: Manifest) -> None:
        """Snapshots a crash or an earlier diff left behind (never the live one)."""
        for entry in self.root.iterdir():
            if entry.is_dir() and entry.name != manifest.snapshot and entry.name.lstrip(".").startswith("s"):
                shutil.rmtree(entry, ignore_errors=True)


class GeometryStoreWriter:
    """Fed by the importer's single pass (node, way, relation callbacks); ``close`` commits the store."""

    def __init__(self, root: Path, bits: dict[str, int]) -> None:
        self.root = Path(root)
        self.bits = bits
        self.snapshot = "s000000"
        self.base = self.root / self.snapshot
        self.base.mkdir(parents=True)
        self.counts = dict.fromkeys(("nodes", "ways", "way_nodes", "relations", "members"), 0)
        self._flushes = 0
        self._reset()

    def _reset(self) -> None:
        self._node_id, self._lon, self._lat = array("q"), array("d"), array("d")
        self._way_id, self._seq, self._way_node = array("q"), array("i"), array("q")
        self._rel: list[tuple[int, int, str, int, str]] = []

    def node(self, n: osmium.osm.Node) -> None:
        if n.location.valid():
            self._node_id.append(n.id)
            self._lon.append(n.location.lon)
            self._lat.append(n.location.lat)
            self.counts["nodes"] += 1
            self._maybe_flush()

    def way(self, w: osmium.osm.Way) -> None:
        for i, ref in enumerate(w.nodes):
            self._way_id.append(w.id)
            self._seq.append(i)
            self._way_node.append(ref.ref)
        self.counts["ways"] += 1
        self.counts["way_nodes"] += len(w.nodes)
        self._maybe_flush()

    def relation(self, r: osmium.osm.Relation) -> None:
        self._rel.extend((r.id, i, m.type, m.ref, m.role) for i, m in enumerate(r.members))
        self.counts["relations"] += 1
        self.counts["members"] += len(r.members)
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if max(len(self._node_id), len(self._way_id), len(self._rel)) >= _FLUSH_ROWS:
            self._flush()

    def _flush(self) -> None:
        part = f"{self._flushes:05d}"
        self._flushes += 1
        nodes = pa.table({"id": pa.array(self._node_id, pa.int64()), "lon": pa.array(self._lon, pa.float64()),
                          "lat": pa.array(self._lat, pa.float64())})
        way_nodes = pa.table({"way_id": pa.array(self._way_id, pa.int64()), "seq": pa.array(self._seq, pa.int32()),
                              "node_id": pa.array(self._way_node, pa.int64())})
        write_partitioned(self.base / "nodes", nodes, "nodes", part, self.bits["node"])
        write_partitioned(self.base / "way_nodes", way_nodes, "way_nodes", part, self.bits["way"])
        # A closed way lists its first node twice: the reverse index holds each (node, way) pair once.
        pairs = pa.table({"node_id": way_nodes["node_id"], "way_id": way_nodes["way_id"]})
        write_partitioned(self.base / "node_ways", pairs.group_by(["node_id", "way_id"]).aggregate([]),
                          "node_ways", part, self.bits["node"])
        if self._rel:
            rel_id, seq, mtype, mid, role = zip(*self._rel, strict=True)
            members = pa.table({"rel_id": pa.array(rel_id, pa.int64()), "seq": pa.array(seq, pa.int32()),
                                "member_type": pa.array(mtype, pa.string()), "member_id": pa.array(mid, pa.int64()),
                                "role": pa.array(role, pa.string())})
            write_partitioned(self.base / "members", members, "members", part, self.bits["relation"])
        self._reset()

    def close(self, sequence: int | None) -> dict[str, int]:
        """Write what is buffered and the manifest; returns the row counts (store.json's ``geometry``)."""
        self._flush()
        for name in SCHEMAS:
            if not has_files(self.base / name):
                write_empty(self.base / name, name)
        write_manifest(self.root, Manifest(snapshot=self.snapshot, sequence=sequence, counts=dict(self.counts),
                                           bits=self.bits))
        return dict(self.counts)
