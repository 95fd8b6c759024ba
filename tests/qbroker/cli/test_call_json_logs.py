"""``qbroker call`` with ``QBROKER_LOG_FORMAT=json`` (docs/logging.md): stdout holds the reply alone, and
every line on stderr is JSON, the library's lines (``-v``), aio-pika's and the CLI's own messages (a
`fail` reply, a warning, no broker) included."""

from __future__ import annotations

from tests.json_log_lines import json_lines
from tests.qbroker.cli.conftest import Example
from tests.qbroker.cli.helpers import run_cli

JSON_LOGS = {"QBROKER_LOG_FORMAT": "json"}


async def test_call_in_json_mode(amqp_url: str, example: Example) -> None:
    ok = await run_cli(amqp_url, "-v", "call", "clitest.echo", "text=ab", "times=2", **JSON_LOGS)
    assert (ok.code, ok.json()) == (0, {"text": "abab"})
    library = json_lines(ok.stderr, "qbroker -v call")
    assert any(line["event"] == "connected" for line in library)  # -v: the library's lines, as JSON

    failed = await run_cli(amqp_url, "call", "clitest.bad", **JSON_LOGS)
    assert failed.code == 2 and not failed.stdout
    [said] = json_lines(failed.stderr, "qbroker call (fail)")
    assert said["level"] == "error" and "bad_tile" in said["event"]

    warned = await run_cli(amqp_url, "call", "clitest.warn", **JSON_LOGS)
    assert (warned.code, warned.json()) == (0, {"done": 1})
    [said] = json_lines(warned.stderr, "qbroker call (warn)")
    assert said["level"] == "warning" and said["event"] == "qbroker: warning: partial: only half done"


async def test_no_broker_in_json_mode() -> None:
    down = await run_cli("amqp://guest:guest@127.0.0.1:1/", "-v", "call", "clitest.echo", **JSON_LOGS)
    assert down.code == 3 and not down.stdout
    lines = json_lines(down.stderr, "qbroker call (no broker)")
    assert "no broker reachable" in lines[-1]["event"] and lines[-1]["level"] == "error"
