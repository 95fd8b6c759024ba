"""``QBROKER_LOG_FORMAT=json`` for the running programs (docs/logging.md): the queuemaster, a renderer,
toposm-web and qbroker-dead-letter, run as an operator runs them, write JSON on every line of their output,
the lines of aio-pika, aiormq and aiohttp included, and their service lines (``metrics serving``,
``queuemaster online``, ``toposm-web serving``, ...) name their unit's app and uuid. A program that
cannot reach the broker says so in one JSON line too."""

from __future__ import annotations

import subprocess
import urllib.request
from pathlib import Path

import pytest

from harness.private_node import free_port
from qbroker.cli.dead_letter import APP as DEAD_LETTER
from qbroker.exit_codes import ExitCode
from services.tiles.queuemaster.service import APP as QUEUEMASTER
from services.tiles.renderer.process import APP as RENDERER
from services.web.service import APP as WEB
from tests.json_log_lines import json_lines, service_lines
from tests.services.tiles.conftest import BIN, Proc, TileBus, wait_renderers
from tests.services.web.conftest import start_web

BROKER_DOWN = "amqp://guest:guest@127.0.0.1:1/"


async def test_every_program_logs_json_with_its_unit(bus: TileBus, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QBROKER_LOG_FORMAT", "json")
    queuemaster = bus.queuemaster("--metrics-port", str(free_port()))
    renderer = bus.renderer("--metrics-port", str(free_port()))
    collector = Proc(
        [str(BIN / "qbroker-dead-letter"), "--metrics-port", str(free_port())], bus.url, bus.tmp / "dead-letter.log"
    )
    bus.procs.append(collector)
    client = await bus.client()
    await wait_renderers(client, 1)
    reply = await client.call("toposm.queuemaster", {"command": "render", "tile": "5/3/4"}, timeout=60)
    assert reply["command"] == "rendered"
    web = start_web(bus)
    with urllib.request.urlopen(web.url + "/", timeout=10) as response:  # noqa: S310 - our own server
        assert response.status == 200
    for proc in (web.proc, renderer, queuemaster, collector):
        proc.stop()  # graceful: the stopping lines are logged too

    started = {"unit started", "metrics serving", "stopping"}
    service_lines(json_lines(queuemaster.log.read_text(), "queuemaster"), QUEUEMASTER, started | {"queuemaster online"})
    service_lines(json_lines(renderer.log.read_text(), "renderer"), RENDERER, started)
    service_lines(json_lines(web.proc.log.read_text(), "toposm-web"), WEB, {"unit started", "toposm-web serving"})
    service_lines(
        json_lines(collector.log.read_text(), "qbroker-dead-letter"), DEAD_LETTER, started | {"collecting dead letters"}
    )


@pytest.mark.parametrize("program", ["toposm-queuemaster", "qbroker-dead-letter"])
def test_no_broker_is_one_json_line_naming_the_unit(program: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(BIN / program)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "QBROKER_URL": BROKER_DOWN, "QBROKER_LOG_FORMAT": "json"},
    )
    assert done.returncode == ExitCode.UNREACHABLE
    assert not done.stdout
    lines = json_lines(done.stderr, program)
    assert len(lines) == 1, lines  # the failed connects' own lines are debug; the error names every URL
    fatal = lines[-1]
    assert fatal["level"] == "critical" and "no broker reachable" in fatal["event"] and fatal.get("app"), fatal
