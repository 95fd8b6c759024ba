"""The stats job over the queuemaster's render log (and optional request logs).

Render log lines: services/toposm/render_log.py (``RENDER_SCHEMA`` is drawn from its ``FIELDS``). Duration
percentiles are exact (Spark's ``percentile``, linear interpolation like numpy's default) and are taken
over successful renders only: a failed render's duration measures how fast it failed, not rendering.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

from services.spark_bridge.job_context import JobContext
from services.spark_bridge.stats_output import write_outputs
from services.toposm import render_log

_SPARK_TYPES = {str: StringType, int: LongType, float: DoubleType}
RENDER_SCHEMA = StructType(
    [StructField(f.name, _SPARK_TYPES[f.kind]()) for f in render_log.FIELDS]
    + [StructField("_corrupt_record", StringType())]
)
REQUEST_SCHEMA = StructType(
    [
        StructField("tile", StringType()),
        StructField("metatile", StringType()),
        StructField("zoom", LongType()),
        StructField("time", DoubleType()),
        StructField("start", DoubleType()),
        StructField("_corrupt_record", StringType()),
    ]
)
# "toposm.render.<host>.<pid>.<thread>" (the renderer's endpoint) or "<host>.<pid>.<thread>"; a host
# may itself be dotted (FQDN), so pid and thread are taken from the end.
_RENDERER_HOST = r"^(?:toposm\.render\.)?(.+?)(?:\.\d+\.\d+)?$"
WINDOWS_IN_RESULT = 1000
FAILURE_SAMPLES = 20
PERCENTILES = (0.5, 0.95, 0.99)


class StatsInputError(ValueError):
    """No usable render records."""


@dataclass(frozen=True)
class StatsParams:
    window_seconds: int = 60
    since: float | None = None
    until: float | None = None
    chart: bool = False


def _read_json_lines(spark: SparkSession, paths: list[Path], schema: StructType) -> DataFrame:
    frame = spark.read.schema(schema).option("mode", "PERMISSIVE").json([str(p) for p in paths])
    # Spark refuses queries that touch only the corrupt-record column of raw JSON unless cached.
    return frame.cache()


def _with_percentiles(frame: DataFrame) -> DataFrame:
    out = frame
    for i, name in enumerate(("p50", "p95", "p99")):
        out = out.withColumn(name, F.col("pct")[i])
    return out.drop("pct")


def _rows(frame: DataFrame, order: str) -> list[dict[str, Any]]:
    return [row.asDict() for row in frame.orderBy(order).collect()]


def _time_filter(frame: DataFrame, column: str, params: StatsParams) -> DataFrame:
    if params.since is not None:
        frame = frame.where(F.col(column) >= params.since)
    if params.until is not None:
        frame = frame.where(F.col(column) < params.until)
    return frame


def render_stats(renders: DataFrame, params: StatsParams) -> dict[str, Any]:
    ok = F.col("status") == render_log.STATUS_OK
    failed = F.when(~ok, 1)
    ok_duration = F.when(ok, F.col("duration"))
    per_zoom = renders.groupBy("zoom").agg(
        F.count(F.lit(1)).alias("renders"),
        F.count(failed).alias("failures"),
        F.round(F.avg(ok_duration), 6).alias("mean"),
        F.max(ok_duration).alias("max"),
        F.percentile(ok_duration, F.array(*[F.lit(p) for p in PERCENTILES])).alias("pct"),
    )
    per_host = renders.groupBy("host").agg(
        F.count(F.lit(1)).alias("renders"),
        F.count(failed).alias("failures"),
        F.countDistinct("renderer").alias("renderers"),
        F.round(F.avg(ok_duration), 6).alias("mean"),
        F.percentile(ok_duration, F.array(*[F.lit(p) for p in PERCENTILES])).alias("pct"),
    )
    window = F.floor(F.col("start") / params.window_seconds) * params.window_seconds
    windows = (
        renders.groupBy(window.cast("long").alias("window_start"))
        .agg(F.count(F.lit(1)).alias("renders"), F.count(failed).alias("failures"))
        .withColumn("renders_per_second", F.round(F.col("renders") / F.lit(float(params.window_seconds)), 6))
    )
    failures = renders.where(~ok).orderBy(F.desc("start")).limit(FAILURE_SAMPLES)
    return {
        "per_zoom": _rows(_with_percentiles(per_zoom), "zoom"),
        "per_host": _rows(_with_percentiles(per_host), "host"),
        "windows": _rows(windows, "window_start"),
        "recent_failures": [{k: r[k] for k in ("metatile", "renderer", "start", "reason")} for r in failures.collect()],
    }


def request_stats(requests: DataFrame, params: StatsParams) -> dict[str, Any]:
    tile = F.coalesce(F.col("tile"), F.col("metatile"))
    stamped = requests.select(
        F.coalesce(F.col("zoom"), F.split(tile, "/")[0].cast("long")).alias("zoom"),
        F.coalesce(F.col("time"), F.col("start")).alias("time"),
    ).where(F.col("time").isNotNull())
    stamped = _time_filter(stamped, "time", params)
    window = (F.floor(F.col("time") / params.window_seconds) * params.window_seconds).cast("long")
    return {
        "requests": stamped.count(),
        "per_zoom": _rows(stamped.groupBy("zoom").agg(F.count(F.lit(1)).alias("requests")), "zoom"),
        "windows": _rows(
            stamped.groupBy(window.alias("window_start")).agg(F.count(F.lit(1)).alias("requests")), "window_start"
        ),
    }


def run_stats(
    paths: list[Path], request_paths: list[Path], params: StatsParams, out_dir: Path, ctx: JobContext
) -> dict[str, Any]:
    spark = ctx.spark
    ctx.set_phase("reading")
    raw = _read_json_lines(spark, paths, RENDER_SCHEMA)
    try:
        usable = (
            F.col("_corrupt_record").isNull()
            & F.col("zoom").isNotNull()
            & F.col("start").isNotNull()
            & F.col("duration").isNotNull()
            & F.col("status").isNotNull()
        )
        counts = raw.agg(F.count(F.lit(1)).alias("lines"), F.count(F.when(usable, 1)).alias("usable")).first()
        assert counts is not None  # a global aggregate always has one row
        ctx.count("lines", int(counts["lines"]))
        ctx.count("bad_lines", int(counts["lines"] - counts["usable"]))
        renders = (
            raw.where(usable)
            .drop("_corrupt_record")
            .withColumn("host", F.regexp_extract(F.coalesce(F.col("renderer"), F.lit("unknown")), _RENDERER_HOST, 1))
        )
        renders = _time_filter(renders, "start", params)
        ctx.set_phase("aggregating")
        result = render_stats(renders, params)
    finally:
        raw.unpersist()
    if not result["per_zoom"]:
        raise StatsInputError(f"no usable render records in {', '.join(str(p) for p in paths)}")
    result["renders"] = sum(z["renders"] for z in result["per_zoom"])
    result["failures"] = sum(z["failures"] for z in result["per_zoom"])
    result["window_seconds"] = params.window_seconds
    result["bad_lines"] = ctx.counters["bad_lines"]
    ctx.count("renders", result["renders"])
    if request_paths:
        ctx.set_phase("requests")
        requests = _read_json_lines(spark, request_paths, REQUEST_SCHEMA)
        try:
            result["requests"] = request_stats(requests.where(F.col("_corrupt_record").isNull()), params)
        finally:
            requests.unpersist()
    ctx.set_phase("writing")
    result["outputs"] = write_outputs(result, out_dir, chart=params.chart)
    if len(result["windows"]) > WINDOWS_IN_RESULT:
        result["windows_truncated"] = len(result["windows"])
        result["windows"] = result["windows"][-WINDOWS_IN_RESULT:]
    return result
