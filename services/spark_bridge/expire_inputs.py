"""Classifying and reading the inputs of an expiry job: osmChange, expire lists, lon/lat points.

Input kind is decided by the file name: ``.osc``/``.osc.gz`` are osmChange; ``.parquet`` (file or
directory) and ``.csv``/``.csv.gz`` are lon/lat points; anything else is an expire list (``z/x/y`` per
line, as written by osm2pgsql ``-e`` and imposm ``-expiretiles-dir``).
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from services.spark_bridge.osc_reader import OSC_SUFFIXES, OscError, sniff_osc
from services.spark_bridge.tilemath import MAX_ZOOM_LIMIT, shift_left

_TILE_LINE = re.compile(r"^\s*(\d{1,2})/(\d{1,8})/(\d{1,8})\s*$")


class InputKind(StrEnum):
    OSC = "osc"
    EXPIRE_LIST = "expire_list"
    PARQUET = "parquet"
    CSV = "csv"


class InputError(ValueError):
    """A job input that is missing or malformed; the message names the file and the problem."""


@dataclass(frozen=True)
class ExpireInput:
    path: Path
    kind: InputKind


def classify(path: Path) -> InputKind:
    name = path.name.lower()
    if name.endswith(OSC_SUFFIXES):
        return InputKind.OSC
    if name.endswith(".parquet") or path.is_dir():
        return InputKind.PARQUET
    if name.endswith((".csv", ".csv.gz")):
        return InputKind.CSV
    return InputKind.EXPIRE_LIST


def _first_data_line(path: Path) -> str | None:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if line.strip():
                return line
    return None


def validate_inputs(paths: Iterable[str]) -> list[ExpireInput]:
    """Submit-time checks: every file exists and its head parses. Raises InputError."""
    inputs: list[ExpireInput] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if not path.exists():
            raise InputError(f"{raw}: no such file or directory")
        kind = classify(path)
        try:
            if kind is InputKind.OSC:
                sniff_osc(path)
            elif kind is InputKind.EXPIRE_LIST:
                first = _first_data_line(path)
                if first is not None and not _TILE_LINE.match(first):
                    raise InputError(f"{raw}: not an expire list (first line {first.strip()[:60]!r})")
            elif kind is InputKind.CSV:
                header = _first_data_line(path) or ""
                columns = {c.strip().lower() for c in header.split(",")}
                if not {"lon", "lat"} <= columns:
                    raise InputError(f"{raw}: CSV needs a header with lon and lat columns")
        except OscError as exc:
            raise InputError(str(exc)) from exc
        except (OSError, EOFError, UnicodeError) as exc:
            raise InputError(f"{raw}: cannot read: {exc}") from exc
        inputs.append(ExpireInput(path=path.resolve(), kind=kind))
    if not inputs:
        raise InputError("paths is empty: give at least one input file")
    return inputs


def read_expire_lists(spark: SparkSession, paths: list[Path]) -> tuple[DataFrame, int | None, int]:
    """(z, x, y) rows of expire lists, the smallest zoom seen and the line count.

    A malformed or out-of-range line fails the job (InputError naming the file and line); checking it
    costs one pass, shared with the smallest-zoom and line counts.
    """
    lines = spark.read.text([str(p) for p in paths]).withColumn("source", F.input_file_name())
    lines = lines.where(F.trim("value") != "")
    pattern = _TILE_LINE.pattern
    parsed = lines.select(
        "value",
        "source",
        F.when(F.regexp_extract("value", pattern, 1) != "", F.regexp_extract("value", pattern, 1).cast("int")).alias(
            "z"
        ),
        F.regexp_extract("value", pattern, 2).cast("long").alias("x"),
        F.regexp_extract("value", pattern, 3).cast("long").alias("y"),
    )
    size = shift_left(F.lit(1).cast("long"), F.coalesce(F.col("z"), F.lit(0)))
    in_range = F.col("z").isNotNull() & (F.col("z") <= MAX_ZOOM_LIMIT) & (F.col("x") < size) & (F.col("y") < size)
    check = parsed.agg(
        F.count(F.lit(1)).alias("lines"),
        F.min("z").alias("smallest"),
        F.first(F.when(~in_range, F.concat_ws(": bad expire-list line ", "source", "value")), ignorenulls=True).alias(
            "bad"
        ),
    ).first()
    assert check is not None  # a global aggregate always has one row
    if check["bad"] is not None:
        raise InputError(check["bad"][:300])
    return parsed.select("z", "x", "y"), check["smallest"], int(check["lines"])


def read_points(spark: SparkSession, inputs: list[ExpireInput]) -> DataFrame | None:
    """(lon, lat) rows of Parquet and CSV inputs; None when there are none."""
    frames: list[DataFrame] = []
    for item in inputs:
        if item.kind is InputKind.PARQUET:
            frame = spark.read.parquet(str(item.path))
        elif item.kind is InputKind.CSV:
            frame = spark.read.option("header", "true").csv(str(item.path))
        else:
            continue
        columns = {c.lower(): c for c in frame.columns}
        if "lon" not in columns or "lat" not in columns:
            raise InputError(f"{item.path}: needs lon and lat columns, has {sorted(frame.columns)}")
        frames.append(
            frame.select(
                F.col(columns["lon"]).cast("double").alias("lon"),
                F.col(columns["lat"]).cast("double").alias("lat"),
            )
        )
    if not frames:
        return None
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union
