"""A replication diff through ``toposm-replicate --postgis`` alone (no embedded store, no bridge): the demo's
edit on the Helsinki extract, osm2pgsql --append with its expiry, the metatiles published on both wires.
Prints JSON; needs bin/ensure-postgis, bin/ensure-osm-data and RabbitMQ (a vhost of its own).

    .venv/bin/python bench/postgis_replicate.py [--repeat 5] [--min-zoom 10] [--max-zoom 18]

Per run, on a fresh import: ``append_s`` is osm2pgsql --append with --expire-tiles alone (the diff applied
to a fresh import, then the import redone), ``batch_s`` the follower's whole batch (osm2pgsql, reading the
expiry, publishing, recording the sequence) and ``heard_s`` from the follower's start of the round to the
last expiry list heard by a listener on qbroker's alert exchange.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from demo.osm_changes import helsinki_edit, publish  # noqa: E402
from harness.broker import create_vhost, delete_vhost, url_for_vhost  # noqa: E402
from harness.osm import helsinki_extract, postgis_database  # noqa: E402
from qbroker import Config, Unit  # noqa: E402
from services.osmstore.postgis import ExpireOutput, append_postgis, import_postgis, psql  # noqa: E402
from services.replicate.batch import build_batch  # noqa: E402
from services.replicate.follower import Follower, FollowSettings  # noqa: E402
from services.replicate.source import LocalSource  # noqa: E402
from services.toposm.contract import EXPIRE_TOPIC  # noqa: E402


def fresh(extract: Path, dsn: str) -> None:
    import_postgis(extract, dsn)
    psql(dsn, "DROP TABLE IF EXISTS planet_osm_replication_status")


async def one_run(extract: Path, dsn: str, url: str, tmp: Path, zooms: tuple[int, int]) -> dict[str, float | int]:
    source = tmp / "replication"
    # osm2pgsql alone, on the diff the follower will merge (a batch of one).
    fresh(extract, dsn)
    batch = await build_batch(LocalSource(source), 1, 1, tmp / "alone", published=1)
    started = time.perf_counter()
    append_postgis(batch.path, dsn, expire=ExpireOutput(*zooms, tmp / "alone.tiles"))
    append_s = time.perf_counter() - started
    tiles = len((tmp / "alone.tiles").read_text().split())
    (tmp / "alone.tiles").unlink()
    # The follower, alone, with a listener on the bus.
    fresh(extract, dsn)
    heard: list[tuple[float, str]] = []
    listener = Unit("bench.listener", config=Config(url=url))

    @listener.on_alert(EXPIRE_TOPIC)
    async def on_expire(body: str) -> None:
        heard.append((time.perf_counter(), body))

    await listener.start()
    settings = FollowSettings(
        source=source,
        store=None,
        store_name="postgis",
        postgis=dsn,
        spool=tmp / "spool",
        start=1,
        min_zoom=zooms[0],
        max_zoom=zooms[1],
    )
    follower = Follower(Unit("toposm.replicate", config=Config(url=url)), settings)
    await follower.unit.start()
    try:
        started = time.perf_counter()
        await follower.catch_up()
        batch_s = time.perf_counter() - started
        metatiles = int(
            follower.metrics_server.registry.get_sample_value("toposm_replicate_expired_metatiles_total") or 0
        )
        while len({t for _, body in heard for t in body.split(";")}) < metatiles:
            await asyncio.sleep(0.01)
        heard_s = heard[-1][0] - started
    finally:
        await follower.unit.stop()
        await listener.stop()
    return {
        "append_s": round(append_s, 3),
        "batch_s": round(batch_s, 3),
        "heard_s": round(heard_s, 3),
        "tiles": tiles,
        "metatiles": metatiles,
        "messages": len(heard),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--min-zoom", type=int, default=10)
    p.add_argument("--max-zoom", type=int, default=18)
    a = p.parse_args()
    extract = helsinki_extract()
    db = f"toposm_bench_{os.getpid()}"
    dsn = postgis_database(db)
    vhost = create_vhost("bench-postgis")
    load = [os.getloadavg()[0]]
    runs: list[dict[str, float | int]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            edit = helsinki_edit(extract)
            publish(Path(tmp) / "replication", 1, edit.text, "2026-11-24T00:01:00Z")
            for _ in range(a.repeat):
                runs.append(
                    asyncio.run(one_run(extract, dsn, url_for_vhost(vhost), Path(tmp), (a.min_zoom, a.max_zoom)))
                )
                load.append(os.getloadavg()[0])
    finally:
        delete_vhost(vhost)
        psql(dsn.rsplit("/", 1)[0] + "/postgres", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    median = {k: statistics.median(float(r[k]) for r in runs) for k in ("append_s", "batch_s", "heard_s")}
    what = f"the demo's: Mikonkatu renamed ({len(edit.streets)} ways), a building corner moved, a new building"
    print(
        json.dumps(
            {
                "edit": what,
                "zooms": [a.min_zoom, a.max_zoom],
                "nproc": os.cpu_count(),
                "load": [round(x, 2) for x in load],
                "runs": runs,
                "median": {k: round(v, 3) for k, v in median.items()},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
