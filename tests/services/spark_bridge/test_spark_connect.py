"""The same bridge code against Spark Connect (sc://): expire, progress without a status tracker, cancel.

A Connect server is started on loopback from the pyspark package's own ``spark-submit``; the bridge runs
as a separate process because a Python process holds either a classic or a Connect session, not both.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from spark_helpers import oracle_point_tiles, oracle_propagate, per_zoom
from test_spark_standalone import free_port, stop, wait_for

from harness import HANG, eventually
from harness.osm import OscNode, OscWay, write_osc
from harness.pytest_plugin import heavy

SPARK_SUBMIT = Path(pyspark.__file__).parent / "bin" / "spark-submit"
CONNECT_SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"
VENV_BIN = Path(sys.executable).parent
pytestmark = pytest.mark.skipif(not SPARK_SUBMIT.exists(), reason=f"spark-submit not shipped at {SPARK_SUBMIT}")


@pytest.fixture(scope="module")
@heavy("starts a Spark Connect server")
def connect_url(tmp_path_factory) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("spark-connect")
    port = free_port()
    server = subprocess.Popen(
        [
            str(SPARK_SUBMIT),
            "--class",
            CONNECT_SERVER,
            "--master",
            "local[2]",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            f"spark.connect.grpc.binding.port={port}",
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            "spark.sql.shuffle.partitions=4",
            "spark-internal",
        ],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        stdout=(logs / "connect.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for(lambda: "Spark Connect server started" in (logs / "connect.log").read_text(), 120, "Connect server")
        yield f"sc://127.0.0.1:{port}"
    finally:
        # spark-submit forks the JVM: signal the whole process group we created.
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(10)


@pytest.fixture
def connect_bridge(connect_url, amqp_url, tmp_path) -> Iterator[subprocess.Popen]:
    bridge = subprocess.Popen(
        [
            str(VENV_BIN / "qbroker-spark-bridge"),
            "--master",
            connect_url,
            "--max-jobs",
            "2",
            "--state-dir",
            str(tmp_path / "state"),
            "--input-root",
            str(tmp_path),
            "--max-tiles-ceiling",
            str(10**10),
            "--max-tiles-per-geometry-ceiling",
            str(10**10),
            "--app",
            "spark.bridge.connect",
            "--progress-interval",
            "0.3",
        ],
        env={**os.environ, "QBROKER_URL": amqp_url},
        stdout=(tmp_path / "bridge.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    yield bridge
    stop(bridge)


async def test_expire_progress_and_cancel_over_spark_connect(connect_bridge, make_unit, tmp_path) -> None:
    client = await make_unit("test.connect.client")
    progress: list[dict] = []

    @client.on_alert("spark.progress.#")
    async def on_progress(body: dict) -> None:
        progress.append(body)

    await client.start()

    async def bridge_up() -> bool:
        await client.call("spark.job", {"command": "list"}, timeout=3)
        return True

    await eventually(
        bridge_up,
        2 * HANG,
        1,
        ignore=(Exception,),  # not consuming yet
        context=lambda: (tmp_path / "bridge.log").read_text()[-3000:],
    )

    nodes = [OscNode(1, 2.35, 48.85), OscNode(2, 2.36, 48.86), OscWay(9, [1, 2])]
    diff = write_osc(tmp_path / "paris.osc", modify=nodes)
    reply = await client.call(
        "spark.expire",
        {"paths": [str(diff)], "min_zoom": 12, "max_zoom": 15, "publish": False, "wait": True},
        timeout=150,
    )
    result = reply["result"]
    covered = oracle_point_tiles(2.35, 48.85, 15) | oracle_point_tiles(2.36, 48.86, 15)
    assert reply["state"] == "succeeded"
    assert set(result["tiles_per_zoom"]) == set(per_zoom(oracle_propagate(covered, 12)))
    assert result["tiles_per_zoom"]["12"] == per_zoom(oracle_propagate(covered, 12))["12"]

    long_osc = write_osc(tmp_path / "long.osc", modify=[OscNode(1, -170, 10), OscNode(2, 170, 10.5), OscWay(3, [1, 2])])
    job = await client.call(
        "spark.expire",
        {
            "paths": [str(long_osc)],
            "min_zoom": 0,
            "max_zoom": 22,
            "publish": False,
            "max_tiles_per_geometry": 10**10,
            "max_tiles": 10**10,
        },
    )

    async def phase() -> str:
        return (await client.call("spark.job", {"command": "status", "job_id": job["job_id"]}))["phase"]

    async def expiring() -> bool:
        return await phase() == "expiring"

    await eventually(expiring, interval=0.3)
    snapshot = await client.call("spark.job", {"command": "progress", "job_id": job["job_id"]})
    assert snapshot["state"] == "running" and snapshot["spark"] is None  # no status tracker under Connect
    # The call's own timeout is the ceiling: a cancel that hangs fails with CallTimeout.
    cancelled = await client.call("spark.job", {"command": "cancel", "job_id": job["job_id"]}, timeout=30)
    assert cancelled["state"] == "cancelled"
    assert any(p["job_id"] == job["job_id"] and p["state"] == "running" for p in progress)
