"""Discovery and debugging across qbroker and the original QBroker: each finds the other's units, and
qbroker-debug names the original's messages and sees the original's calls to itself."""

from __future__ import annotations

import signal

import pytest

from services.toposm.tilemath import ZoomRange
from services.web.collector import Collector
from services.web.status import StatusModel
from services.web.web_metrics import WebMetrics
from tests.conftest import MakeUnit
from tests.qbroker.cli.helpers import Snooper, run_cli
from tests.qbroker.interop.conftest import StartOriginal


async def test_the_original_discovers_qbroker_units(qbroker_units: MakeUnit, original: StartOriginal) -> None:
    unit = await qbroker_units("qb.found")

    @unit.rpc("qb.echo")
    async def echo(text: str) -> str:
        return text

    await unit.start()
    orig = await original("orig.seeker", serve=False)
    # Its broadcast ping (application/json+obj, no body) ...
    polled = await orig.command("poll", name="qbroker.ping", max_delay=1.5)
    found = {r["data"]["uuid"]: r["data"] for r in polled["replies"] if "data" in r}
    assert found[unit.uuid]["app"] == "qb.found" and "qb.echo" in found[unit.uuid]["endpoints"]
    # ... its ping addressed to an app, and to one unit (on rpc, the name in its routing-key header) ...
    by_app = await orig.rpc("qbroker.ping", dest="qb.found")
    assert by_app["ok"]["uuid"] == unit.uuid
    by_uuid = await orig.rpc("qbroker.ping", uuid=unit.uuid)
    assert by_uuid["ok"]["uuid"] == unit.uuid and by_uuid["ok"]["app"] == "qb.found"
    # ... and its calls addressed to a unit reach that unit's endpoint; a name it does not serve is no server.
    assert (await orig.rpc("qb.echo", "direct", uuid=unit.uuid))["ok"] == "direct"
    assert (await orig.rpc("not.here", uuid=unit.uuid))["error"]["type"] == "MsgError"


async def test_qbroker_list_shows_original_units(
    qbroker_units: MakeUnit, original: StartOriginal, fresh_url: str
) -> None:
    unit = await qbroker_units("qb.lister")
    await unit.start()
    orig = await original("orig.listed")
    listed = await run_cli(fresh_url, "list", "--json", "--timeout", "3")
    assert listed.code == 0, listed.stderr
    units = {u["uuid"]: u for u in listed.json()}
    assert units[unit.uuid]["app"] == "qb.lister"
    shown = units[orig.uuid]
    assert shown["app"] == "orig.listed" and shown["dialect"] == "original"
    # What it serves, asked of it at its own address.
    assert {"orig.echo", "orig.fail", "orig.bytes"} <= set(shown["endpoints"])
    assert "orig.alert" in shown["listeners"]
    table = await run_cli(fresh_url, "list", "--timeout", "3")
    assert "orig.listed (original)" in table.stdout and "orig.echo" in table.stdout


async def test_toposm_webs_status_view_shows_original_units(qbroker_units: MakeUnit, original: StartOriginal) -> None:
    web = await qbroker_units("toposm.web")
    model = StatusModel()
    collector = Collector(web, model, WebMetrics(model), zooms=ZoomRange())
    await web.start()
    await original("orig.on.the.page", serve=False)
    await collector.poll_units()
    assert "orig.on.the.page" in {unit["app"] for unit in model.snapshot()["units"]}


async def test_qbroker_debug_names_the_originals_messages(
    qbroker_units: MakeUnit, original: StartOriginal, fresh_url: str
) -> None:
    unit = await qbroker_units("qb.watched")
    await unit.start()
    server = await original("orig.watched.server")
    client = await original("orig.watched.client", serve=False)
    snooper = await Snooper.start(fresh_url, "--json", "--body", "--recheck", "0")
    try:
        # One original unit calling another: the debugger followed both from their ping answers.
        assert (await client.rpc("orig.echo", {"q": 1}))["ok"] == {"q": 1}
        request = await snooper.next_event(kind="request", name="orig.echo")
        reply = await snooper.next_event(kind="reply", correlation_id=request["message_id"])
        # qbroker calling the original, and the original's error element.
        await unit.call("orig.echo", "hi")
        await snooper.next_event(kind="reply", name="orig.echo", uuid=server.uuid, body="hi")
        with pytest.raises(ValueError):
            await unit.call("orig.fail", 3, debug=True)
        failed = await snooper.next_event(kind="reply", name="orig.fail", status="error")
    finally:
        code, _, _ = await snooper.stop(signal.SIGTERM)
    assert request["app"] == "orig.watched.client" and request["uuid"] == client.uuid
    assert request["body"] == {"q": 1}
    assert reply["app"] == "orig.watched.server" and reply["to_app"] == "orig.watched.client"
    assert reply["status"] == "ok" and reply["body"] == {"q": 1}
    assert failed["app"] == "orig.watched.server" and failed["error_id"] == "python.ValueError"
    assert failed["error_message"] == "bad value: 3"
    assert code == 0
