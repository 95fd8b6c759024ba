"""``configure_logging(json=True)`` (docs/logging.md): the standard library's lines, Python's warnings and
uncaught exceptions (the main thread's and another's) come out as JSON lines with the same fields as
structlog's own, and a library's INFO chatter stays out unless the level is DEBUG."""

from __future__ import annotations

import subprocess
import sys

from tests.json_log_lines import json_lines

SCRIPT = """
import logging, sys, threading, warnings
import structlog
from qbroker.log import bind_process, configure_logging

configure_logging(sys.argv[1], json=True)
bind_process(app="test.pipeline", uuid="u1")
structlog.get_logger("test").info("structlog line")
logging.getLogger("aiormq.connection").info("library chatter")
logging.getLogger("aiormq.connection").error("library error %s", "text", exc_info=ValueError("bad"))
warnings.warn("careful")
thread = threading.Thread(target=lambda: 1 / 0)
thread.start()
thread.join()
raise RuntimeError("boom")
"""


def run(level: str) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, level], capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"}
    )
    assert done.returncode == 1 and not done.stdout
    lines = json_lines(done.stderr, "stderr")
    assert all(line["app"] == "test.pipeline" and line["uuid"] == "u1" for line in lines), lines
    return lines


def test_every_line_json_with_the_process_fields() -> None:
    lines = run("INFO")
    assert [(line["event"], line["level"]) for line in lines] == [
        ("structlog line", "info"),
        ("library error text", "error"),
        (lines[2]["event"], "warning"),
        ("uncaught exception in a thread", "critical"),
        ("uncaught exception", "critical"),
    ]
    assert lines[1]["logger"] == "aiormq.connection" and "ValueError: bad" in str(lines[1]["exception"])
    assert lines[2]["logger"] == "py.warnings" and "careful" in str(lines[2]["event"])
    assert "ZeroDivisionError" in str(lines[3]["exception"]) and "RuntimeError: boom" in str(lines[4]["exception"])


def test_debug_shows_the_libraries_chatter() -> None:
    assert "library chatter" in [line["event"] for line in run("DEBUG")]
