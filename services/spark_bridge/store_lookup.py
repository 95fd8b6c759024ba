"""Lookups of a diff's ids in the geometry store: by primary key on the driver, or in Spark at scale.

A store-backed expiry looks the diff's neighbourhood up in three dependent steps (store_expire). The
geometry store is SQLite keyed by id (services.osmstore.geometry), so a lookup is one B-tree probe per id:
what it costs follows the diff, not the store (the same diff reads the same few thousand rows from a city or
from 200 cities: docs/performance.md, "The OSM pipeline at scale: the geometry store on SQLite").

- Up to ``driver_bytes`` of rows per step (estimated: ids x ROW_BYTES of the lookup; DRIVER_LOOKUP_BYTES
  by default): the driver queries the store itself, one statement per lookup. A minutely diff, on a city
  or on the planet, is a few thousand ids: milliseconds.
- Bigger steps (a daily diff of millions of objects on a planet store) run in Spark: the ids are range-
  partitioned into tasks of about SPARK_IDS_PER_TASK ids and each task queries the store file itself
  (``mapInArrow``, read-only), so the probes are spread over the executors, and the driver then holds
  only the rows that matched. The store must be on a filesystem the executors see (as for any input).

Both give the same rows (the order is not kept and not needed: the resolution builds sets and sorts
vertices by ``seq``). ``driver_bytes=0`` forces Spark (tests run both ways).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from services.osmstore.geometry import GeometryStore, Manifest, connect, lookup
from services.spark_bridge.expire_collect import collect_tables

# Spark's view of each lookup's rows (LOOKUPS' Arrow schemas).
_SPARK_SCHEMAS = {
    "nodes": "id long, lon double, lat double",
    "way_nodes": "way_id long, seq long, node_id long",
    "node_ways": "node_id long, way_id long",
    "members": "rel_id long, member_type string, member_id long",
    "node_relations": "node_id long, rel_id long",
    "way_relations": "way_id long, rel_id long",
    "relation_way_nodes": "way_id long, seq long, node_id long",
}
# Estimated bytes a lookup returns per id (Arrow, decoded): a node 24; a way ~10 refs of 24; a node is in
# ~1.5 ways; a relation ~10 members; a street way is in a few route relations; a route or boundary relation
# lists ~100 ways of ~10 refs. What the driver budget is measured in.
ROW_BYTES = {
    "nodes": 24,
    "node_ways": 24,
    "way_nodes": 240,
    "members": 400,
    "node_relations": 64,
    "way_relations": 64,
    "relation_way_nodes": 24_000,
}
# Lookups of up to this many ids take them as one JSON literal; more go as a local relation.
INLINE_KEYS = 100_000
# Estimated bytes of rows one lookup step may fetch on the driver (a minutely diff: well under 1 MB; a
# daily planet diff: hundreds of MB, which Spark spreads over its executors).
DRIVER_LOOKUP_BYTES = 64 << 20
SPARK_IDS_PER_TASK = 50_000

Wanted = tuple[str, set[int]]  # (lookup, ids)


def estimated_bytes(name: str, ids: set[int]) -> int:
    return len(ids) * ROW_BYTES[name]


def _task(db: str, name: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """What one Spark task runs: the lookup of its ids, against the store file opened read-only."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        with closing(connect(Path(db), readonly=True)) as conn:
            for batch in batches:
                if batch.num_rows:
                    yield from lookup(conn, name, batch.column(0).to_pylist()).to_batches()

    return run


class StoreLookups:
    """``fetch`` answers several lookups of one step: small ones on the driver, the rest in one Spark action."""

    def __init__(
        self, spark: SparkSession, store: GeometryStore, manifest: Manifest, driver_bytes: int = DRIVER_LOOKUP_BYTES
    ) -> None:
        self.spark, self.store, self.manifest, self.driver_bytes = spark, store, manifest, driver_bytes
        self.spark_steps = 0  # steps that needed Spark (counted into the job's inputs)

    def find(self, name: str, ids: set[int]) -> DataFrame:
        """The rows of lookup ``name`` for ``ids``, looked up by Spark tasks (see the module's doc).

        The ids go as one JSON string literal exploded into a frame (a plan holding thousands of literals took
        PySpark long to analyse: docs/performance.md, "Spark bridge: small jobs"); above INLINE_KEYS ids as a
        local relation."""
        keys = sorted(ids)
        if len(keys) <= INLINE_KEYS:
            # json.dumps of ints: nothing but digits and commas reaches the literal.
            literal = F.from_json(F.lit(json.dumps(keys)), "array<bigint>")
            wanted = self.spark.range(1).select(F.explode(literal).alias("id"))
        else:
            wanted = self.spark.createDataFrame(pa.table({"id": pa.array(keys, pa.int64())}))
        tasks = max(1, len(keys) // SPARK_IDS_PER_TASK)
        if tasks > 1:
            wanted = wanted.repartitionByRange(tasks, "id")
        return wanted.mapInArrow(_task(str(self.store.db), name), _SPARK_SCHEMAS[name])

    def fetch(self, wanted: dict[str, Wanted]) -> dict[str, pa.Table]:
        """Every lookup's rows (LOOKUPS): what fits the driver's budget (shared by the step's lookups) read
        there, the rest in one Spark action."""
        out: dict[str, pa.Table] = {}
        in_spark: dict[str, DataFrame] = {}
        budget = self.driver_bytes
        with self.store.lookups() as conn:
            for key, (name, ids) in wanted.items():
                size = estimated_bytes(name, ids)
                if ids and size > budget:
                    in_spark[key] = self.find(name, ids)
                    continue
                budget -= size
                out[key] = lookup(conn, name, ids)
        if in_spark:
            self.spark_steps += 1
            out.update(collect_tables(in_spark))
        return out
