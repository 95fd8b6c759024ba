"""``qbroker-spark-bridge`` with ``QBROKER_LOG_FORMAT=json`` (docs/logging.md): every line it writes is
JSON, its Spark JVM's included (log4j's, laid out by the bridge's log4j2 file, and the lines the JVM writes
itself), and its service lines name its unit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from harness import HANG, eventually
from harness.private_node import free_port
from services.spark_bridge.jvm_log import DRIVER_JAVA_OPTIONS, JVM_LOGGER, jvm_log_conf
from tests.json_log_lines import json_lines, service_lines

BIN = Path(sys.executable).parent
APP = "spark.bridge.json"


async def test_the_bridge_and_its_jvm_log_json(amqp_url: str, make_unit, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "bridge.log"
    with log.open("wb") as out:
        bridge = subprocess.Popen(
            [
                str(BIN / "qbroker-spark-bridge"),
                "--master",
                "local[1]",
                "--app",
                APP,
                "--state-dir",
                str(tmp_path / "state"),
                "--input-root",
                str(tmp_path),
                "--metrics-port",
                str(free_port()),
            ],
            env={**os.environ, "QBROKER_URL": amqp_url, "QBROKER_LOG_FORMAT": "json"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        client = await make_unit("test.json.bridge.client")
        await client.start()

        async def bridge_up() -> bool:
            await client.call("spark.job", {"command": "list"}, timeout=3)
            return True

        await eventually(bridge_up, 2 * HANG, 1, ignore=(Exception,), context=lambda: log.read_text()[-3000:])
        listing = tmp_path / "expire.list"
        listing.write_text("15/17000/11000\n")
        reply = await client.call(
            "spark.expire",
            {"paths": [str(listing)], "min_zoom": 14, "max_zoom": 15, "publish": False, "wait": True},
            timeout=2 * HANG,
        )
        assert reply["state"] == "succeeded"
        bridge.send_signal(signal.SIGTERM)  # the bridge alone: it stops its JVM itself
        assert bridge.wait(HANG) == 0, log.read_text()[-3000:]
    finally:
        if bridge.poll() is None:
            os.killpg(bridge.pid, signal.SIGKILL)
            bridge.wait()
    lines = json_lines(log.read_text(), "qbroker-spark-bridge")
    service_lines(lines, APP, {"unit started", "metrics serving", "spark bridge online", "stopping"})
    jvm = [line for line in lines if line.get("logger") == JVM_LOGGER or line.get("logger", "").startswith("org.")]
    assert jvm, "no line of the JVM's"  # log4j's warnings and the JVM's own notes come through as JSON
    assert all(line.get("app") == APP for line in jvm), jvm
    assert not any(line["level"] == "info" and line.get("logger", "").startswith("org.") for line in lines)


def test_the_operators_java_options_come_after_ours() -> None:
    options = jvm_log_conf({DRIVER_JAVA_OPTIONS: "-Dqbroker.jvm.level=info"})[DRIVER_JAVA_OPTIONS]
    first, _, rest = options.partition(" ")
    path = first.removeprefix('-Dlog4j2.configurationFile="').removesuffix('"')
    assert Path(path).is_file() and rest.endswith("-Dqbroker.jvm.level=info")  # the JVM takes the last -D
