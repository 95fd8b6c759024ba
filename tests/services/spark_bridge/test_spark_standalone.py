"""The bridge as a real process (console script) on a real standalone Spark cluster, driven by the CLI.

Master and worker are started on loopback from the ``spark-class`` that the pyspark package ships.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from spark_helpers import oracle_metatiles, oracle_point_tiles, oracle_propagate, per_zoom

from harness import HANG
from harness.osm import OscNode, write_osc
from harness.private_node import free_port
from harness.pytest_plugin import heavy

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
VENV_BIN = Path(sys.executable).parent
pytestmark = pytest.mark.skipif(not SPARK_CLASS.exists(), reason=f"spark-class not shipped at {SPARK_CLASS}")


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception:  # noqa: BLE001 - not up yet
            value = None
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what} not ready after {timeout} s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
@heavy("starts a Spark standalone master and worker")
def standalone_master(tmp_path_factory) -> Iterator[tuple[str, int]]:
    logs = tmp_path_factory.mktemp("spark-cluster")
    port, ui, worker_ui = free_port(), free_port(), free_port()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(logs), "PYSPARK_PYTHON": sys.executable}
    master = subprocess.Popen(
        [
            str(SPARK_CLASS),
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(ui),
        ],
        env=env,
        stdout=(logs / "master.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    worker = subprocess.Popen(
        [
            str(SPARK_CLASS),
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            "127.0.0.1",
            "--cores",
            "1",
            "--memory",
            "1g",
            "--webui-port",
            str(worker_ui),
            "--work-dir",
            str(logs / "work"),
            f"spark://127.0.0.1:{port}",
        ],
        env=env,
        stdout=(logs / "worker.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    try:

        def alive_workers() -> int:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as r:
                return json.load(r)["aliveworkers"]

        wait_for(alive_workers, 3 * HANG, "standalone master with a worker")  # ceilings: hangs only
        yield f"spark://127.0.0.1:{port}", ui
    finally:
        stop(worker)
        stop(master)


def cli(amqp_url: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV_BIN / "qbroker"), *args],
        env={**os.environ, "QBROKER_URL": amqp_url},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_expire_on_standalone_cluster_via_cli(standalone_master, amqp_url, tmp_path) -> None:
    if shutil.which("qbroker", path=str(VENV_BIN)) is None:
        pytest.fail("qbroker console script missing from the virtualenv")
    master, ui = standalone_master
    state = tmp_path / "state"
    bridge = subprocess.Popen(
        [
            str(VENV_BIN / "qbroker-spark-bridge"),
            "--master",
            master,
            "--max-jobs",
            "1",
            "--state-dir",
            str(state),
            "--input-root",
            str(tmp_path),
            "--app",
            "spark.bridge.standalone",
            "--conf",
            "spark.executor.memory=512m",
            "--conf",
            "spark.cores.max=1",
            "--conf",
            "spark.sql.shuffle.partitions=2",
        ],
        env={**os.environ, "QBROKER_URL": amqp_url},
        stdout=(tmp_path / "bridge.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(
            lambda: cli(amqp_url, "call", "spark.job", "list", "--timeout", "3").returncode == 0,
            5 * HANG,
            "bridge process",
        )
        nodes = [OscNode(1, 7.44, 46.95), OscNode(2, -122.42, 37.77), OscNode(3, 139.69, 35.68)]
        diff = write_osc(tmp_path / "changes.osc.gz", modify=nodes)
        done = cli(
            amqp_url,
            "call",
            "spark.expire",
            f'paths=["{diff}"]',
            "min_zoom=10",
            "max_zoom=14",
            "publish=false",
            "wait=true",
            "--timeout",
            "170",
            "--raw",
        )
        assert done.returncode == 0, done.stderr + (tmp_path / "bridge.log").read_text()[-3000:]
        reply = json.loads(done.stdout)
        expected: set = set()
        for n in nodes:
            expected |= oracle_point_tiles(n.lon, n.lat, 14)
        expected = oracle_propagate(expected, 10)
        assert reply["state"] == "succeeded"
        assert reply["result"]["tiles_per_zoom"] == per_zoom(expected)
        assert reply["result"]["total_metatiles"] == len(oracle_metatiles(expected))
        # The work ran on the cluster: the bridge is a registered application holding the worker's core.
        with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as r:
            apps = json.load(r)["activeapps"]
        assert [a["cores"] for a in apps if a["name"] == "qbroker-spark-bridge"] == [1]
        status = cli(amqp_url, "call", "spark.job", "status", f"job_id={reply['job_id']}", "--raw")
        assert json.loads(status.stdout)["state"] == "succeeded"
        render_log = tmp_path / "render.log"
        render_log.write_text(
            "".join(
                json.dumps(
                    {
                        "metatile": "12/8/8",
                        "zoom": 12,
                        "renderer": "toposm.render.vader.7.1",
                        "start": 1000.0 + i,
                        "duration": float(i),
                        "status": "ok",
                    }
                )
                + "\n"
                for i in range(1, 5)
            )
        )
        stats = cli(
            amqp_url, "call", "spark.stats", f'paths=["{render_log}"]', "wait=true", "--timeout", "170", "--raw"
        )
        assert stats.returncode == 0, stats.stderr
        zooms = json.loads(stats.stdout)["result"]["per_zoom"]
        assert zooms[0]["zoom"] == 12 and zooms[0]["p50"] == 2.5 and zooms[0]["renders"] == 4
        failed = cli(amqp_url, "call", "spark.expire", 'paths=["/nonexistent.osc"]')
        assert failed.returncode == 2 and "outside the bridge's input roots" in failed.stdout + failed.stderr
    finally:
        stop(bridge)
    # Clean shutdown on SIGTERM; the finished job is still on disk for the next bridge.
    assert bridge.returncode == 0, (tmp_path / "bridge.log").read_text()[-3000:]
    assert json.loads((state / "jobs" / f"{reply['job_id']}.json").read_text())["state"] == "succeeded"
