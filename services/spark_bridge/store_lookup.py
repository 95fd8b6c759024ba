"""Lookups of a diff's ids in the geometry store's tables: on the driver when small, else in Spark.

A store-backed expiry looks the diff's neighbourhood up in three dependent steps (store_expire). Each
lookup reads only the Parquet partitions (``bucket=B``) its ids fall in, and what it needs of them is
known before anything is read: the partitions' files and, from their footers, their decoded size.

- Up to ``driver_bytes`` of decoded rows per step (DRIVER_LOOKUP_BYTES by default): the driver reads those
  files itself with pyarrow and filters them on the key (``is_in``). A city store's partition is read in a
  few milliseconds, where a Spark job of its own cost 0.12-0.24 s per step on a warm local session (up to
  seconds on a loaded machine), most of a minutely diff's resolution. The driver already reads the same
  partitions whole when it applies the diff to the store (geometry_apply), so this needs nothing Spark
  does not: the store is on the bridge's filesystem whatever the master.
- Anything bigger (a planet store, a daily diff touching many partitions) is read by Spark as before: one
  Spark action per step, the ids as one JSON literal broadcast-joined, partitions pruned statically. The
  driver then holds only the rows that matched, never a partition.

Both give the same rows (the order of rows is not kept and not needed: the resolution builds sets and
sorts vertices by ``seq``). ``driver_bytes=0`` forces Spark (tests run both ways).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from services.osmstore.geometry import SCHEMAS, GeometryStore, Manifest, bucket_dir, table_bits
from services.spark_bridge.expire_collect import collect_tables

_SPARK_SCHEMAS = {
    "nodes": "id long, lon double, lat double, bucket long",
    "way_nodes": "way_id long, seq int, node_id long, bucket long",
    "node_ways": "node_id long, way_id long, bucket long",
    "members": "rel_id long, seq int, member_type string, member_id long, role string, bucket long",
}
# What a lookup returns from each table (its key column first).
COLUMNS = {
    "nodes": ["id", "lon", "lat"],
    "way_nodes": ["way_id", "seq", "node_id"],
    "node_ways": ["node_id", "way_id"],
    "members": ["rel_id", "member_type", "member_id"],
}
# Lookups of up to this many ids take them as one JSON literal; more go as a broadcast local relation.
INLINE_KEYS = 100_000
# Decoded bytes of store partitions one lookup step may read on the driver (the Helsinki store is ~5 MB
# in all; one planet partition of a few million nodes is ~100 MB, so a planet diff goes to Spark).
DRIVER_LOOKUP_BYTES = 64 << 20
# Partition files a step may open on the driver (their footers are read to size them): beyond this the
# diff is spread over many partitions, which is Spark's case anyway.
DRIVER_LOOKUP_FILES = 256

Wanted = tuple[str, set[int]]  # (table, ids)


def _sql_list(values: set[int]) -> str:
    return ",".join(str(int(v)) for v in sorted(values))  # int(): nothing but digits reaches the SQL text


@dataclass(frozen=True)
class _Files:
    paths: list[Path]
    decoded_bytes: int


class StoreLookups:
    """``fetch`` answers several lookups of one step: small ones on the driver, the rest in one Spark action."""

    def __init__(self, spark: SparkSession, store: GeometryStore, manifest: Manifest,
                 driver_bytes: int = DRIVER_LOOKUP_BYTES) -> None:
        self.spark, self.store, self.manifest, self.driver_bytes = spark, store, manifest, driver_bytes
        self.spark_steps = 0  # steps that needed Spark (counted into the job's inputs)

    def _buckets(self, table: str, ids: set[int]) -> set[int]:
        bits = table_bits(table, self.manifest.bits)
        return {k >> bits for k in ids}

    def _files(self, table: str, ids: set[int], limit_bytes: int) -> _Files | None:
        """The files of the partitions ``ids`` fall in, or None when they exceed the driver's budget."""
        table_dir = self.store.table_dir(table, self.manifest)
        paths: list[Path] = []
        size = 0
        for bucket in sorted(self._buckets(table, ids)):
            part = bucket_dir(table_dir, bucket)
            if not part.is_dir():
                continue  # no partition: no rows (Spark reads nothing there either)
            # Spark skips hidden files ("." and "_"); so does the driver.
            paths += sorted(p for p in part.glob("*.parquet") if not p.name.startswith((".", "_")))
            if len(paths) > DRIVER_LOOKUP_FILES:
                return None
        for path in paths:
            meta = pq.read_metadata(path)
            size += sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
            if size > limit_bytes:
                return None
        return _Files(paths, size)

    def _read(self, table: str, ids: set[int], files: _Files) -> pa.Table:
        key = COLUMNS[table][0]
        schema = SCHEMAS[table]
        parts = [pq.read_table(p, columns=COLUMNS[table], schema=schema) for p in files.paths]
        rows = pa.concat_tables(parts) if parts else self._empty(table)
        return rows.filter(pc.is_in(rows[key], value_set=pa.array(sorted(ids), pa.int64())))

    @staticmethod
    def _empty(table: str) -> pa.Table:
        return SCHEMAS[table].empty_table().select(COLUMNS[table])

    def find(self, table: str, ids: set[int]) -> DataFrame:
        """Rows of ``table`` whose key is one of ``ids``, reading only the partitions they fall in (Spark).

        Partitions are pruned statically (``bucket IN (...)``, the buckets computed here: a short list).
        The ids go as one JSON string literal, exploded into a frame and broadcast-joined on the key.
        They used to go inline as an SQL ``IN (...)`` list, but classic PySpark analyses a plan at every
        transformation, and a plan holding 20,000 literals took 0.3-0.5 s to build and as long again to
        optimise, per lookup (one literal: ~0.05 s, the lookup's run 0.15-0.35 s instead of 0.3-0.5 s).
        ``Column.isin`` is worse (a JVM call per value), and a frame made with ``createDataFrame`` is an
        RDD scan, so its broadcast is a Spark job of its own; above INLINE_KEYS ids it is used anyway, so
        that no literal gets huge."""
        key = COLUMNS[table][0]
        keys = sorted(ids)
        rows = self.spark.read.schema(_SPARK_SCHEMAS[table]).parquet(str(self.store.table_dir(table, self.manifest)))
        if not keys:
            return rows.where(F.lit(False)).select(*COLUMNS[table])  # optimised away: no Spark work
        rows = rows.where(F.expr(f"bucket IN ({_sql_list(self._buckets(table, ids))})"))
        if len(keys) <= INLINE_KEYS:
            # json.dumps of ints: nothing but digits and commas reaches the literal.
            literal = F.from_json(F.lit(json.dumps(keys)), "array<bigint>")
            wanted = self.spark.range(1).select(F.explode(literal).alias(key))
        else:
            wanted = self.spark.createDataFrame(pa.table({key: pa.array(keys, pa.int64())}))
        return rows.join(F.broadcast(wanted), key).select(*COLUMNS[table])

    def fetch(self, wanted: dict[str, Wanted]) -> dict[str, pa.Table]:
        """Every lookup's rows (COLUMNS of its table): what fits the driver's budget (shared by the step's
        lookups) read there, the rest in one Spark action."""
        out: dict[str, pa.Table] = {}
        in_spark: dict[str, DataFrame] = {}
        budget = self.driver_bytes
        for name, (table, ids) in wanted.items():
            if not ids:
                out[name] = self._empty(table)
                continue
            files = self._files(table, ids, budget) if budget > 0 else None
            if files is None:
                in_spark[name] = self.find(table, ids)
                continue
            budget -= files.decoded_bytes
            out[name] = self._read(table, ids, files)
        if in_spark:
            self.spark_steps += 1
            out.update(collect_tables(in_spark))
        return out
