"""The Spark JVM's log lines in the program's log pipeline: WARN and above, in its format.

A classic session's driver JVM (and in ``local[*]`` its executors) logs with log4j2 to the bridge's stderr.
Spark's default configuration writes every INFO line in log4j's own layout, which a JSON log shipper
cannot read and an operator does not need; the bridge passes a log4j2 file of its own instead
(``-Dlog4j2.configurationFile`` in ``spark.driver.extraJavaOptions``): WARN and above only, laid out as
the bridge's own lines, one JSON object each under ``QBROKER_LOG_FORMAT=json``, with the unit's app and
uuid (docs/logging.md, docs/decisions.md).

The JVM also writes lines log4j never sees (``WARNING: Using incubator modules``, which Spark's launcher
always causes; a crash's ``Exception in thread``): in JSON mode its stderr comes through the bridge, which
passes its JSON lines on and logs any other line as the ``event`` of a JSON line of its own. A Spark
Connect server's JVM is its own program, with its own log.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
from importlib.resources import files
from typing import IO

from qbroker.log import DroppingLogger, json_lines, operator_line, process_fields

DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
JVM_LOGGER = "spark.jvm"  # the ``logger`` of a JVM line log4j did not lay out
JSON_CONFIG = "log4j2-json.properties"
CONSOLE_CONFIG = "log4j2-console.properties"
_PLAIN_WORD = re.compile(r"[A-Za-z0-9._:-]{1,255}")


def jvm_log_conf(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` with the driver's Java options naming the bridge's log4j2 file first; options the operator
    gave come after ours, so a ``-Dqbroker.jvm.level=info`` of theirs (or a log4j2 file) wins."""
    config = files(__package__) / (JSON_CONFIG if json_lines() else CONSOLE_CONFIG)
    fields = process_fields()
    options = [f'-Dlog4j2.configurationFile="{config}"']  # quoted: Spark splits the options at spaces
    # Only plain words go into the JVM's template: a quote or a backslash there would break its JSON.
    options += [
        f"-Dqbroker.{key}={value}"
        for key in ("app", "uuid")
        if isinstance(value := fields.get(key), str) and _PLAIN_WORD.fullmatch(value)
    ]
    given = conf.get(DRIVER_JAVA_OPTIONS, "").strip()
    return {**conf, DRIVER_JAVA_OPTIONS: " ".join([*options, *([given] if given else [])])}


def start_jvm(conf: dict[str, str]) -> None:
    """In JSON mode, launch this process's Spark JVM (``conf`` a classic session's, master and app name
    included) with its stderr read by the bridge; the session built next uses it. Without JSON logs, or
    when a JVM runs already, nothing to do: Spark launches its own, writing to stderr directly."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if not json_lines() or getattr(SparkContext, "_gateway", None) is not None:
        return
    gateway = launch_gateway(
        SparkConf(loadDefaults=False).setAll(list(conf.items())), popen_kwargs={"stderr": subprocess.PIPE}
    )
    threading.Thread(target=_forward, args=(gateway.proc.stderr,), name="spark-jvm-stderr", daemon=True).start()
    SparkContext._ensure_initialized(gateway=gateway)  # type: ignore[attr-defined]


def _forward(stderr: IO[bytes]) -> None:
    out = DroppingLogger()
    for raw in stderr:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line.strip():
            continue
        if _is_json_object(line):
            out.msg(line)
        else:
            operator_line(line, "warning", logger=JVM_LOGGER)


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False
