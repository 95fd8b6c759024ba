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

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from services.osmstore.osc_input import OSC_SUFFIXES, UnreadableOsc, sniff_osc
from services.spark_bridge.confine import InputRefused, InputRoots
from services.spark_bridge.tile_columns import MAX_ZOOM_LIMIT, shift_left

_TILE_LINE = re.compile(r"^\s*(\d{1,2})/(\d{1,8})/(\d{1,8})\s*$")
_TILE_LINE_BYTES = re.compile(_TILE_LINE.pattern.encode())  # bytes: \d and \s are ASCII-only, as in Java
# Plain expire lists up to this size (about 200,000 lines) are read on the driver, bigger ones by Spark.
DRIVER_LIST_BYTES = 4 << 20
FIRST_LINE_SCAN = 1000
FIRST_LINE_CHARS = 4096


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
    name: str  # as the caller gave it: what error messages say (never the resolved path, never content)


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
        # Bounded: a file of one endless line (or endless blank lines) is not read whole at submit time.
        for _ in range(FIRST_LINE_SCAN):
            line = handle.readline(FIRST_LINE_CHARS)
            if not line:
                return None
            if line.strip():
                return line
    return None


def validate_inputs(paths: Iterable[str], roots: InputRoots) -> list[ExpireInput]:
    """Submit-time checks: every path is an allowed input (see confine) and its head parses.

    Raises InputRefused (path not allowed, missing, wrong type) or InputError (content). Messages name
    the caller's path and the problem, never the file's contents.
    """
    inputs: list[ExpireInput] = []
    for raw in paths:
        path = roots.file_or_parquet_dir(raw)
        kind = classify(path)
        if path.is_dir() and kind is not InputKind.PARQUET:
            raise InputRefused("bad_input_type", f"{raw!r} is a directory but not named .parquet")
        try:
            if kind is InputKind.OSC:
                sniff_osc(path, raw)
            elif kind is InputKind.EXPIRE_LIST:
                first = _first_data_line(path)
                if first is not None and not _TILE_LINE.match(first):
                    raise InputError(f"{raw}: not an expire list (its first line is not z/x/y)")
            elif kind is InputKind.CSV:
                header = _first_data_line(path) or ""
                columns = {c.strip().lower() for c in header.split(",")}
                if not {"lon", "lat"} <= columns:
                    raise InputError(f"{raw}: CSV needs a header with lon and lat columns")
        except UnreadableOsc as exc:
            raise InputError(str(exc)) from None
        except (OSError, EOFError, UnicodeError) as exc:
            # The exception's text may quote bytes of the file (gzip, codecs): name the kind only.
            raise InputError(f"{raw}: cannot read ({type(exc).__name__})") from None
        inputs.append(ExpireInput(path=path, kind=kind, name=raw))
    if not inputs:
        raise InputError("paths is empty: give at least one input file")
    return inputs


@dataclass
class ListTiles:
    """Expire-list tiles as (z, x, y) rows, their line count and smallest zoom.

    ``rows`` holds the tiles themselves when the lists were read on the driver (then every check on them
    is driver work, no Spark action).
    """

    frame: DataFrame
    lines: int
    smallest_zoom: int | None
    rows: tuple[list[int], list[int], list[int]] | None = None


def read_expire_lists(spark: SparkSession, paths: list[Path], names: dict[Path, str] | None = None) -> ListTiles:
    """(z, x, y) rows of expire lists, the smallest zoom seen and the line count.

    A malformed or out-of-range line fails the job (InputError naming the file and line). Small plain
    lists (a minutely osm2pgsql list is a few hundred KB) are parsed on the driver and handed to Spark as
    Arrow: a Spark pass just to check them cost a whole action. Bigger or compressed ones are checked in
    one Spark pass, shared with the smallest-zoom and line counts. Errors name each file as ``names`` says
    (the caller's own spelling; default its path).
    """
    names = names or {}
    if all(not p.name.endswith(".gz") for p in paths) and sum(p.stat().st_size for p in paths) <= DRIVER_LIST_BYTES:
        return _read_on_driver(spark, paths, names)
    lines = spark.read.text([str(p) for p in paths]).withColumn("source", F.input_file_name())
    lines = lines.where(F.trim("value") != "")
    pattern = _TILE_LINE.pattern
    parsed = lines.select(
        "value",
        "source",
        F.when(F.regexp_extract("value", pattern, 1) != "", F.regexp_extract("value", pattern, 1).cast("int")).alias(
            "z"
        ),
        # try_cast: an unmatched line extracts '' and Spark's ANSI cast error would quote the line.
        F.regexp_extract("value", pattern, 2).try_cast("long").alias("x"),
        F.regexp_extract("value", pattern, 3).try_cast("long").alias("y"),
    )
    size = shift_left(F.lit(1).cast("long"), F.coalesce(F.col("z"), F.lit(0)))
    in_range = F.col("z").isNotNull() & (F.col("z") <= MAX_ZOOM_LIMIT) & (F.col("x") < size) & (F.col("y") < size)
    check = parsed.agg(
        F.count(F.lit(1)).alias("lines"),
        F.min("z").alias("smallest"),
        F.first(F.when(~in_range, F.col("source")), ignorenulls=True).alias("bad"),
    ).first()
    assert check is not None  # a global aggregate always has one row
    if check["bad"] is not None:
        # The file, not the line: error messages never quote input contents.
        by_uri = {p.as_uri(): names.get(p, str(p)) for p in paths}
        raise InputError(
            f"{by_uri.get(check['bad'], Path(check['bad']).name)}: a line is not z/x/y within the zoom limit"
        )
    return ListTiles(parsed.select("z", "x", "y"), int(check["lines"]), check["smallest"])


def _read_on_driver(spark: SparkSession, paths: list[Path], names: dict[Path, str]) -> ListTiles:
    """The driver twin of the Spark pass above, with the same line rules: lines end at \\n, \\r or \\r\\n
    (Hadoop's reader), a line of spaces only is blank (Spark's ``trim``), ASCII digits and whitespace
    (Java's regex classes)."""
    zs: list[int] = []
    xs: list[int] = []
    ys: list[int] = []
    for path in paths:
        for number, line in enumerate(path.read_bytes().splitlines(), start=1):
            if not line.strip(b" "):
                continue
            match = _TILE_LINE_BYTES.match(line)
            z, x, y = (int(g) for g in match.groups()) if match else (MAX_ZOOM_LIMIT + 1, 0, 0)
            if z > MAX_ZOOM_LIMIT or x >= 1 << z or y >= 1 << z:
                # The file and the line number, not the line: error messages never quote input contents.
                raise InputError(
                    f"{names.get(path, str(path))}: a line is not z/x/y within the zoom limit (line {number})"
                )
            zs.append(z)
            xs.append(x)
            ys.append(y)
    table = pa.table({"z": pa.array(zs, pa.int32()), "x": pa.array(xs, pa.int64()), "y": pa.array(ys, pa.int64())})
    # An empty Arrow table has no rows to infer from under Spark Connect: its schema is spelt out.
    frame = spark.createDataFrame(table) if zs else spark.createDataFrame([], "z int, x long, y long")
    return ListTiles(frame, len(zs), min(zs) if zs else None, (zs, xs, ys))


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
            raise InputError(f"{item.name}: needs lon and lat columns")
        frames.append(
            frame.select(  # try_cast: a value that is no number is an invalid point, not an error quoting it
                F.col(columns["lon"]).try_cast("double").alias("lon"),
                F.col(columns["lat"]).try_cast("double").alias("lat"),
            )
        )
    if not frames:
        return None
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union
