"""``qbroker-debug`` as a subprocess: discovery before/after units, pairing, filters, output, cleanup."""

from __future__ import annotations

import asyncio
import re
import signal
from typing import Any

import orjson
import pytest

from harness import eventually
from harness.broker import list_queues, rabbitmqctl
from qbroker import CallTimeout, NoServer, RequestFailed
from tests.qbroker.cli.conftest import Example
from tests.qbroker.cli.helpers import Snooper, run_cli


def debug_queues(vhost: str) -> list[str]:
    return [q for q in list_queues(vhost) if "debug_" in q]


async def test_started_before_unit_follows_it_and_pairs_reply(amqp_url: str, vhost: str, make_unit: Any) -> None:
    snooper = await Snooper.start(amqp_url, "--json", "--body")
    try:
        server = await make_unit("clitest.late")

        @server.rpc("clitest.late.echo")
        async def echo(text: str) -> dict[str, str]:
            return {"echo": text}

        await server.start()
        client = await make_unit("clitest.client")
        await client.start()
        # Both units announce themselves; once the debugger has printed the client's start alert it
        # has bound the reply exchange to the client's uuid.
        start = await snooper.next_event(kind="alert", name="qbroker.start", uuid=client.uuid)
        assert start["app"] == "clitest.client" and start["body"]["uuid"] == client.uuid
        assert await client.call("clitest.late.echo", {"text": "hi"}, timeout=5) == {"echo": "hi"}
        request = await snooper.next_event(kind="request", name="clitest.late.echo")
        reply = await snooper.next_event(kind="reply", correlation_id=request["message_id"])
    finally:
        code, _, _ = await snooper.stop()
    assert request["app"] == "clitest.client" and request["uuid"] == client.uuid
    assert request["reply_to"] == client.uuid and request["body"] == {"text": "hi"}
    assert reply["name"] == "clitest.late.echo"  # the reply got its name from the paired request
    assert reply["app"] == "clitest.late" and reply["uuid"] == server.uuid
    assert reply["to_uuid"] == client.uuid and reply["to_app"] == "clitest.client"
    assert reply["status"] == "ok" and reply["body"] == {"echo": "hi"}
    assert isinstance(reply["latency_ms"], float) and reply["latency_ms"] >= 0
    assert code == 0
    assert debug_queues(vhost) == []


async def test_started_after_unit_discovers_it_with_filters(
    amqp_url: str, vhost: str, example: Example, make_unit: Any
) -> None:
    client = await make_unit("clitest.client")
    await client.start()
    snooper = await Snooper.start(amqp_url, "--json", "--name", "clitest.echo", "--kind", "request,reply")
    units_found = int(re.search(r"(\d+) unit\(s\)", snooper.stderr_lines[-1]).group(1))  # type: ignore[union-attr]
    assert units_found >= 2  # the example unit and the client, found by qbroker.ping
    try:
        with pytest.raises(RequestFailed):
            await client.call("clitest.bad", {}, timeout=5)  # filtered out by --name
        await client.call("clitest.echo", {"text": "a", "times": 2}, timeout=5)
        first = orjson.loads(await snooper.next_line())
        second = orjson.loads(await snooper.next_line())
    finally:
        code, rest, _ = await snooper.stop(signal.SIGTERM)
    assert (first["kind"], second["kind"]) == ("request", "reply")
    assert first["name"] == second["name"] == "clitest.echo"
    assert second["correlation_id"] == first["message_id"] and second["latency_ms"] is not None
    assert "body" not in first  # bodies only with --body
    assert rest == ""  # nothing else passed the filters (no alerts, no clitest.bad)
    assert code == 0
    assert debug_queues(vhost) == []


async def test_status_filter_and_text_lines(amqp_url: str, example: Example, make_unit: Any) -> None:
    client = await make_unit("clitest.client")
    await client.start()
    snooper = await Snooper.start(amqp_url, "--status", "fail,error", "--count", "2")
    await client.call("clitest.echo", {"text": "ok"}, timeout=5)
    with pytest.raises(RequestFailed):
        await client.call("clitest.bad", {}, timeout=5)
    with pytest.raises(Exception, match="db_down"):
        await client.call("clitest.boom", {}, timeout=5)
    code, out, _ = await _finish(snooper)
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2, out
    bad, boom = lines
    assert "reply" in bad and "clitest.bad" in bad and "fail:bad_tile" in bad and "tile out of range" in bad
    assert "clitest.example/" in bad and "-> clitest.client/" in bad and bad.rstrip().split()[0].count(":") == 2
    assert "error:db_down" in boom and "ms" in boom
    assert not any(" ok " in line for line in lines)


async def _finish(snooper: Snooper) -> tuple[int, str, str]:
    """--count ends the debugger by itself."""
    out, err = await asyncio.wait_for(snooper.proc.communicate(), 15)
    assert snooper.proc.returncode is not None
    return snooper.proc.returncode, out.decode(), err.decode()


async def test_does_not_change_routing(amqp_url: str, example: Example, make_unit: Any) -> None:
    """With the debugger running, a request nobody serves still fails fast with no_server (a '#'
    binding would have swallowed it) and the debugger shows it as dead, then the paired reply."""
    client = await make_unit("clitest.client")
    await client.start()
    snooper = await Snooper.start(amqp_url, "--json", "--name", "clitest.nobody")
    try:
        with pytest.raises(NoServer):
            await client.call("clitest.nobody", {}, timeout=3)
        dead = await snooper.next_event(kind="dead")
        reply = await snooper.next_event(kind="reply")
    finally:
        await snooper.stop()
    assert dead["reason"] == "unroutable" and dead["via"].endswith(":clitest.nobody")
    assert reply["status"] == "fail" and reply["error_id"] == "no_server"
    assert reply["correlation_id"] == dead["message_id"] and reply["latency_ms"] is not None


async def test_all_binds_everything_and_says_what_it_costs(amqp_url: str, example: Example, make_unit: Any) -> None:
    """--all sees requests to names nobody announced, at the documented price: while it runs such a
    request is routed to the debugger instead of `dead`, so the caller times out instead of no_server."""
    client = await make_unit("clitest.client")
    await client.start()
    snooper = await Snooper.start(amqp_url, "--all", "--json", "--kind", "request")
    try:
        with pytest.raises(CallTimeout):
            await client.call("clitest.unannounced", {"x": 1}, timeout=1)
        request = await snooper.next_event(name="clitest.unannounced")
    finally:
        await snooper.stop()
    assert request["kind"] == "request" and request["uuid"] == client.uuid
    with pytest.raises(NoServer):  # debugger gone: routing is back to normal
        await client.call("clitest.unannounced", {}, timeout=3)


async def test_follows_cli_calls_and_usage(amqp_url: str, example: Example) -> None:
    snooper = await Snooper.start(amqp_url, "--json", "--from-app", "qbroker.cli", "--kind", "request")
    try:
        result = await run_cli(amqp_url, "call", "clitest.tiles", "stats")
        assert result.code == 0
        request = await snooper.next_event(kind="request")
    finally:
        await snooper.stop()
    assert request["name"] == "clitest.tiles" and request["app"] == "qbroker.cli"
    bad = await run_cli(amqp_url, "--kind", "nonsense", exe=snooper_exe())
    assert bad.code == 64 and "--kind" in bad.stderr


async def test_sees_the_replies_of_short_lived_cli_calls(amqp_url: str, example: Example) -> None:
    """A CLI unit waits at start until the debugger has followed its uuid, so its reply is never missed."""
    snooper = await Snooper.start(amqp_url, "--json", "--body")
    try:
        for n in range(3):
            result = await run_cli(amqp_url, "call", "clitest.echo", f"text=call{n}")
            assert result.code == 0, result.stderr
            request = await snooper.next_event(kind="request", name="clitest.echo")
            assert request["app"] == "qbroker.cli" and request["body"] == {"text": f"call{n}"}
            reply = await snooper.next_event(kind="reply", correlation_id=request["message_id"])
            assert reply["status"] == "ok" and reply["to_app"] == "qbroker.cli"
    finally:
        code, _, _ = await snooper.stop()
    assert code == 0


def snooper_exe() -> str:
    from tests.qbroker.cli.helpers import QBROKER_DEBUG

    return QBROKER_DEBUG


async def test_firehose(amqp_url: str, vhost: str, example: Example, make_unit: Any) -> None:
    client = await make_unit("clitest.client")
    await client.start()
    rabbitmqctl("trace_on", "-p", vhost)
    try:
        snooper = await Snooper.start(amqp_url, "--firehose", "--json", "--name", "clitest.echo")
        try:
            await client.call("clitest.echo", {"text": "f"}, timeout=5)
            request = await snooper.next_event(kind="request")
            reply = await snooper.next_event(kind="reply")
        finally:
            code, _, _ = await snooper.stop()
    finally:
        rabbitmqctl("trace_off", "-p", vhost)
    assert reply["correlation_id"] == request["message_id"] and reply["latency_ms"] is not None
    assert reply["uuid"] == example.unit.uuid and request["uuid"] == client.uuid
    assert code == 0 and debug_queues(vhost) == []


async def test_survives_broker_closing_its_connection(
    amqp_url: str, vhost: str, example: Example, make_unit: Any
) -> None:
    client = await make_unit("clitest.client")
    await client.start()
    snooper = await Snooper.start(amqp_url, "--json", "--kind", "request,reply")
    try:
        old = client.connection
        rabbitmqctl("close_all_connections", "-p", vhost, "cli reconnect test")
        await snooper.wait_stderr("reconnected")
        # Our client was cut off too: call once it is back, not on the connection being torn down.
        await eventually(lambda: client.connection not in (None, old), timeout=60)
        assert await client.wait_connected(60)
        assert await client.call("clitest.echo", {"text": "again"}, timeout=10) == {"text": "again"}
        request = await snooper.next_event(kind="request")
        reply = await snooper.next_event(kind="reply")
    finally:
        code, _, _ = await snooper.stop()
    assert reply["correlation_id"] == request["message_id"] and reply["latency_ms"] is not None
    assert code == 0 and debug_queues(vhost) == []


async def test_no_broker_exits_three(amqp_url: str) -> None:
    result = await run_cli("amqp://guest:guest@127.0.0.1:1/", exe=snooper_exe())
    assert result.code == 3 and "no broker reachable" in result.stderr
