"""Store-backed expiry over Spark Connect, end to end from the shell: the bridge console script with
``--master sc://... --store``, and ``toposm-replicate --once`` applying a replication diff through it."""

# ruff: noqa: F811 - fixtures are imported by name and then requested as parameters
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_spark_connect import connect_url  # noqa: F401 - the Connect server fixture
from test_spark_standalone import stop

from harness import HANG, eventually
from harness.osm import node_xml, osc, read_extract, way_xml
from services.osmstore.geometry import GeometryStore
from services.osmstore.replication import ReplicationState, diff_path, state_path, write_state
from tests.services.osmstore.conftest import helsinki, imported_store, osm_data, store  # noqa: F401 - fixtures

VENV_BIN = Path(sys.executable).parent


# The Helsinki store's lookups fit the driver's default budget; with 0 they run in Spark, over Connect.
@pytest.fixture(params=["64", "0"], ids=["driver-lookups", "spark-lookups"])
def connect_store_bridge(request, connect_url, amqp_url, tmp_path, store) -> Iterator[subprocess.Popen]:
    bridge = subprocess.Popen(
        [
            str(VENV_BIN / "qbroker-spark-bridge"),
            "--master",
            connect_url,
            "--state-dir",
            str(tmp_path / "state"),
            "--input-root",
            str(tmp_path),
            "--store",
            str(store),
            "--driver-lookup-mib",
            request.param,
        ],
        env={**os.environ, "QBROKER_URL": amqp_url},
        stdout=(tmp_path / "bridge.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    yield bridge
    stop(bridge)


async def test_replicate_through_a_connect_bridge(
    connect_store_bridge, make_unit, store, helsinki, amqp_url, tmp_path
) -> None:
    client = await make_unit("test.connect.store.client")
    await client.start()

    async def bridge_up() -> bool:
        await client.call("spark.job", {"command": "list"}, timeout=3)
        return True

    await eventually(
        bridge_up,
        3 * HANG,
        1,
        ignore=(Exception,),  # not consuming yet
        context=lambda: (tmp_path / "bridge.log").read_text()[-3000:],
    )
    extract = read_extract(helsinki)
    street = next(
        w
        for w, (refs, tags) in sorted(extract.ways.items())
        if tags.get("highway") == "residential" and all(r in extract.nodes for r in refs)
    )
    refs, tags = extract.ways[street]
    lon, lat = extract.nodes[refs[0]]
    source = tmp_path / "replication"
    path = diff_path(source, 7)
    path.parent.mkdir(parents=True)
    import gzip

    path.write_bytes(
        gzip.compress(
            osc(
                modify=[node_xml(refs[0], lon + 0.001, lat), way_xml(street, refs, {**tags, "name": "Connectinkatu"})]
            ).encode()
        )
    )
    write_state(state_path(source, 7), ReplicationState(7, "2026-11-24T05:00:00Z"))
    write_state(source / "state.txt", ReplicationState(7, "2026-11-24T05:00:00Z"))
    out = await asyncio.to_thread(
        subprocess.run,
        [
            str(VENV_BIN / "toposm-replicate"),
            "--source",
            str(source),
            "--store",
            str(store),
            "--start",
            "7",
            "--once",
            "--min-zoom",
            "14",
            "--max-zoom",
            "16",
            "--call-timeout",
            "300",
        ],
        capture_output=True,
        text=True,
        timeout=400,
        env={**os.environ, "QBROKER_URL": amqp_url},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert GeometryStore.of_store(store).sequence == 7
    status = json.loads((store / "replication.json").read_text())
    assert status["sequence"] == 7 and status["metatiles"] > 0 and status["inputs"]["ways"] >= 1
