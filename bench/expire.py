"""Benchmark of the Spark expiry pipeline against a plain-Python reference on the same tiles.

Generates N z18 input tiles (seeded, clustered in a 4096x4096-tile region like a busy diff area), writes
them as Parquet, then times on a warm local SparkSession the bridge's pipeline (normalise -> propagate
to every zoom down to --min-zoom -> dedupe by 64-bit key -> 8x8 metatiles -> per-zoom summary, without
publishing), and a plain-Python set-based reference over the same tiles. Prints one JSON document.

    .venv/bin/python bench/expire.py [--sizes 100000,1000000,10000000] [--min-zoom 10]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import functions as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.spark_bridge.expire_job import ExpireParams, metatile_counts, normalise_list_tiles, propagate  # noqa: E402
from services.spark_bridge.spark_session import build_session  # noqa: E402

MAX_ZOOM = 18
REGION = 4096  # z18 tiles per side of the generated region
ORIGIN = (136_000, 90_000)  # a z18 tile in central Europe


def generate(n: int, path: Path, seed: int = 18) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = ORIGIN[0] + rng.integers(0, REGION, n, dtype=np.int64)
    y = ORIGIN[1] + rng.integers(0, REGION, n, dtype=np.int64)
    pq.write_table(pa.table({"z": np.full(n, MAX_ZOOM, dtype=np.int32), "x": x, "y": y}), path)
    return x, y


def spark_pipeline(spark: Any, path: Path, min_zoom: int) -> dict[str, tuple[int, int]]:
    params = ExpireParams(min_zoom=min_zoom, max_zoom=MAX_ZOOM, publish=False)
    tiles = spark.read.parquet(str(path))
    metas = metatile_counts(propagate(normalise_list_tiles(tiles, params), min_zoom))
    rows = metas.groupBy("z").agg(F.sum("tiles").alias("tiles"), F.count(F.lit(1)).alias("metas")).collect()
    return {str(r["z"]): (int(r["tiles"]), int(r["metas"])) for r in rows}


def python_reference(x: list[int], y: list[int], min_zoom: int) -> dict[str, tuple[int, int]]:
    level = set(zip(x, y, strict=True))
    out: dict[str, tuple[int, int]] = {}
    for z in range(MAX_ZOOM, min_zoom - 1, -1):
        out[str(z)] = (len(level), len({(tx >> 3, ty >> 3) for tx, ty in level}))
        level = {(tx >> 1, ty >> 1) for tx, ty in level}
    return out


def timed(fn: Any, *args: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,1000000,10000000")
    parser.add_argument("--min-zoom", type=int, default=10)
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    spark = build_session(
        args.master,
        "bench-expire",
        {"spark.ui.enabled": "false", "spark.driver.memory": "4g", "spark.sql.shuffle.partitions": "8"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        warm = Path(tmp) / "warm.parquet"
        generate(10_000, warm, seed=1)
        spark_pipeline(spark, warm, args.min_zoom)  # warm the JVM and the code paths
        for n in sizes:
            path = Path(tmp) / f"tiles-{n}.parquet"
            x, y = generate(n, path)
            spark_out, spark_s = timed(spark_pipeline, spark, path, args.min_zoom)
            xs, ys = x.tolist(), y.tolist()
            python_out, python_s = timed(python_reference, xs, ys, args.min_zoom)
            total = sum(t for t, _ in spark_out.values())
            results.append(
                {
                    "input_tiles": n,
                    "expired_tiles": total,
                    "metatiles": sum(m for _, m in spark_out.values()),
                    "spark_seconds": round(spark_s, 3),
                    "python_seconds": round(python_s, 3),
                    "spark_input_tiles_per_s": round(n / spark_s),
                    "python_input_tiles_per_s": round(n / python_s),
                    "same_result": spark_out == python_out,
                }
            )
            del xs, ys, x, y
    spark.stop()
    print(
        json.dumps(
            {
                "benchmark": "spark expiry pipeline vs plain Python",
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "master": args.master},
                "zooms": [args.min_zoom, MAX_ZOOM],
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
