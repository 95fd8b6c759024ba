"""Catching up N replication diffs into PostGIS: one osm2pgsql --append per diff vs one merged file (what
toposm-replicate does when behind). Prints JSON; needs bin/ensure-postgis and bin/ensure-osm-data.

    .venv/bin/python bench/replicate_catchup.py [--diffs 5] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.osm import (  # noqa: E402
    helsinki_extract,
    node_xml,
    osc,
    postgis_database,
    publish,  # noqa: E402
    read_extract,
)
from services.osmstore.postgis import append_postgis, import_postgis, psql  # noqa: E402
from services.replicate.batch import build_batch  # noqa: E402
from services.replicate.source import LocalSource  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--diffs", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    extract_path = helsinki_extract()
    db = f"toposm_bench_{os.getpid()}"
    dsn = postgis_database(db)
    extract = read_extract(extract_path)
    nodes = list(extract.nodes.items())
    runs: dict[str, list[float]] = {"one_per_diff": [], "merged": [], "merge_itself": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            source = Path(tmp) / "replication"
            for seq in range(1, a.diffs + 1):  # each diff moves 200 nodes (a busy minute in a city)
                chunk = nodes[(seq - 1) * 200 : seq * 200]
                publish(
                    source, seq, osc(modify=[node_xml(n, x + 0.0001 * seq, y, version=10 + seq) for n, (x, y) in chunk])
                )
            src = LocalSource(source)
            singles = [
                asyncio.run(build_batch(src, s, s, Path(tmp) / "spool", published=a.diffs))
                for s in range(1, a.diffs + 1)
            ]
            for _ in range(a.repeat):
                import_postgis(extract_path, dsn)
                started = time.perf_counter()
                for batch in singles:
                    append_postgis(batch.path, dsn)
                runs["one_per_diff"].append(time.perf_counter() - started)
                import_postgis(extract_path, dsn)
                started = time.perf_counter()
                merged = asyncio.run(build_batch(src, 1, a.diffs, Path(tmp) / "spool", published=a.diffs))
                runs["merge_itself"].append(time.perf_counter() - started)
                append_postgis(merged.path, dsn)
                runs["merged"].append(time.perf_counter() - started)
            size = sum(len(gzip.decompress(asyncio.run(src.diff(s)))) for s in range(1, a.diffs + 1))
    finally:
        psql(dsn.rsplit("/", 1)[0] + "/postgres", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(
        json.dumps(
            {
                "diffs": a.diffs,
                "osc_bytes": size,
                "nproc": os.cpu_count(),
                "load": os.getloadavg()[0],
                "runs": {k: [round(x, 3) for x in v] for k, v in runs.items()},
                "median_s": {k: round(v, 3) for k, v in med.items()},
                "merged_over_one_per_diff": round(med["merged"] / med["one_per_diff"], 3),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
