"""Every running program listens on `toposm` on the seed's `osm` exchange (and on
qbroker's `toposm` alert), and what the seed's programs say there reaches ours; expirations by command are
heard on both wires; a renderer a queuemaster took on `osm` stays there. The seed side is written from its
text alone (plain aio-pika)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from harness import HANG, eventually
from qbroker import Config, Unit
from services.spark_bridge.service import SparkBridge
from services.tiles.render_list import job as render_list_job
from services.tiles.render_list.main import APP as RENDER_LIST_APP
from services.tiles.render_list.main import RenderListService
from services.tiles.render_list.main import parse_args as render_list_args
from services.tiles.render_list.resume import Progress
from services.tiles.renderer.process import RendererProcess
from services.tiles.renderer.settings import RendererSettings

from .conftest import BIN, Proc, TileBus, alert_listener, stats, wait_renderers
from .seed_programs import ask, declare_osm, osm_client, osm_listener, osm_wire_ready

ONLINE = b'{"command": "queuemaster online"}'


async def test_the_expire_command_is_heard_on_both_wires_once(bus: TileBus) -> None:
    """The seed's way to expire is `expire_toposm`: a list expired with the `expire` command (qbroker or
    `osm`) is published there on both wires, once each, and not taken again by the queuemaster itself."""
    bus.queuemaster()
    client = await bus.client()
    heard_on_alert = await alert_listener(bus, "expire_toposm")
    connection, exchange, replies = await osm_client(bus.url)
    try:
        heard_on_osm = await osm_listener(exchange, "expire_toposm")  # bound to expire_toposm on osm only
        await osm_wire_ready(connection)
        answer = await client.call("toposm.queuemaster", {"command": "expire", "tiles": "9/10/20;9/11/21"}, timeout=10)
        assert answer["command"] == "expired" and answer["tiles"] == 2
        on_osm_wire = await ask(exchange, replies, b'{"command": "expire", "tiles": "10/1/2"}')
        assert on_osm_wire["command"] == "expired", on_osm_wire

        def both_heard() -> bool:
            return len(heard_on_alert) == 2 and len(heard_on_osm) == 2

        await eventually(both_heard)
        assert sorted(heard_on_alert) == sorted(heard_on_osm) == ["10/1/2", "9/10/20;9/11/21"]
        # a marker published after them comes after any echo or second copy would have: none came
        await client.alert("expire_toposm", "11/1/1", content_type="text/plain")
        await eventually(lambda: "11/1/1" in heard_on_osm and "11/1/1" in heard_on_alert)
        assert len(heard_on_alert) == len(heard_on_osm) == 3
        counters = (await stats(client))["counters"]
        # 3 tiles by command and 1 by alert, each taken once: the command's own broadcasts were not
        assert counters["expired"] == 4 and counters.get("expiry_twins", 0) == 1, counters
    finally:
        await connection.close()


class ListeningBridge(SparkBridge):
    """The real bridge, remembering what it heard on `toposm` (its Spark session is never built)."""

    heard: list[dict[str, Any]]

    async def _program_command(self, body: dict[str, Any]) -> None:  # type: ignore[override]
        self.heard.append(body)


def no_spark() -> Any:
    raise AssertionError("the bridge's Spark session is not needed here")


async def test_the_spark_bridge_listens_on_toposm_on_both_wires(bus: TileBus, tmp_path: Path) -> None:
    unit = Unit("spark.bridge", config=Config(url=bus.url))
    bridge = ListeningBridge(unit, no_spark, tmp_path / "state")
    bridge.heard = []
    await unit.start()
    bus.units.append(unit)
    client = await bus.client()
    connection, exchange, _ = await osm_client(bus.url)
    try:
        # Only the bridge runs: a mandatory publish to `toposm` on osm is routed (a queue is bound there).
        channel = await connection.channel(publisher_confirms=True)
        osm = await channel.get_exchange("osm")
        await osm.publish(aio_pika.Message(ONLINE), routing_key="toposm", mandatory=True)
        await client.alert("toposm", {"command": "queuemaster online"})
        await eventually(lambda: len(bridge.heard) == 2)
        assert bridge.heard == [{"command": "queuemaster online"}] * 2
    finally:
        await connection.close()


async def test_a_renderer_a_queuemaster_took_on_osm_stays_on_osm(bus: TileBus) -> None:
    """A seed queuemaster's `queuemaster online` registers the threads on `osm`; nobody pings them there, and
    the renderer's watchdog (register again when not pinged) must not move them back to qbroker. Stopping, it
    unregisters on `osm` too."""
    # The queuemaster's own start-up `queuemaster online` (qbroker, then osm) must be out before the renderer
    # listens: heard later, the qbroker one would take the renderer back from the seed's queuemaster below.
    announced_on_alert = await alert_listener(bus, "toposm")
    connection, exchange, _ = await osm_client(bus.url)
    announced_on_osm = await osm_listener(exchange, "toposm")
    bus.queuemaster("--ping-interval", "0.1")
    client = await bus.client()
    unit = Unit("toposm.renderer", config=Config(url=bus.url))
    renderer = RendererProcess(
        unit, RendererSettings(tile_root=bus.tile_root, hostname="osmhost", reregister_after=0.2)
    )
    try:
        await eventually(lambda: announced_on_alert and announced_on_osm, timeout=60)
        await unit.start()
        bus.units.append(unit)
        await renderer.start()
        s = await wait_renderers(client, 1)
        assert s["renderers"][0]["wire"] == "qbroker"
        await osm_wire_ready(connection)  # else the renderer's `register` on osm reaches nobody
        await exchange.publish(aio_pika.Message(ONLINE), routing_key="toposm")  # from a seed-only queuemaster

        async def on_osm() -> dict[str, Any] | None:
            s = await stats(client)
            return s if [r["wire"] for r in s["renderers"]] == ["osm"] else None

        registrations = (await eventually(on_osm))["counters"]["registrations"]
        rounds = renderer.watchdog_rounds
        await eventually(lambda: renderer.watchdog_rounds >= rounds + 6)  # 3x reregister_after
        s = await stats(client)
        assert [r["wire"] for r in s["renderers"]] == ["osm"]
        assert s["counters"]["registrations"] == registrations
        reply = await client.call("toposm.queuemaster", {"command": "render", "tile": "9/10/20"}, timeout=30)
        assert reply["metatile"] == "9/1/2"  # dispatched over osm, reported there
        await renderer.stop()

        async def unregistered() -> bool:
            s = await stats(client)
            return not s["renderers"] and s["counters"].get("renderers_lost", 0) == 0

        await eventually(unregistered)
    finally:
        await connection.close()
        if not renderer.stopping.is_set():
            await renderer.stop()


async def routed_on_osm(url: str, body: bytes) -> None:
    """Published on `osm` to `toposm` as mandatory until the broker routes it (a queue is bound there)."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        osm = await declare_osm(channel)

        async def routed() -> bool:
            try:
                await osm.publish(aio_pika.Message(body), routing_key="toposm", mandatory=True)
            except aio_pika.exceptions.DeliveryError:  # returned: nobody listens there yet
                return False
            return True

        await eventually(routed)
    finally:
        await connection.close()


async def test_a_running_toposm_replicate_listens_on_toposm_on_both_wires(bus: TileBus, tmp_path: Path) -> None:
    """toposm-replicate is a running program too. Only it runs: a mandatory publish to `toposm` on
    osm is routed, and what it hears there and on qbroker's `toposm` alert is logged (it has nothing to do)."""
    store = tmp_path / "store"
    (store / "geometry").mkdir(parents=True)
    # A replication server that is not there: the follower backs off for an hour and keeps running.
    replicate = Proc(
        [
            str(BIN / "toposm-replicate"),
            "--source",
            "http://127.0.0.1:9/replication/minute/",
            "--store",
            str(store),
            "--interval",
            "3600",
        ],
        bus.url,
        bus.tmp / "replicate.log",
    )
    bus.procs.append(replicate)
    await routed_on_osm(bus.url, ONLINE)
    client = await bus.client()

    def heard(wire: str) -> bool:
        return any(
            "heard on toposm" in line and f"wire={wire}" in line for line in replicate.log.read_text().splitlines()
        )

    async def heard_on_alert() -> bool:  # said again until heard: its alert queue may be bound after its osm one
        await client.alert("toposm", {"command": "what's up"})
        return heard("alert")

    await eventually(heard_on_alert, interval=0.5)
    await eventually(lambda: heard("osm"))
    assert replicate.popen.poll() is None  # still running


async def test_a_running_render_list_listens_on_toposm_and_asks_again_when_a_queuemaster_comes(
    bus: TileBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A running toposm-render-list listens on `toposm` on both wires (an unknown command there is
    counted and ignored), and a `queuemaster online` has every request that waits for a queuemaster ask again
    at once: with its pause made an hour long here, the job ends only because it heard the queuemaster."""
    monkeypatch.setattr(render_list_job, "FIRST_PAUSE", 3600.0)
    unit = Unit(RENDER_LIST_APP, config=Config(url=bus.url))
    options = render_list_args(["--bbox=-10,-10,10,10", "--zooms", "0"])  # one metatile
    done = asyncio.Event()
    service = RenderListService(unit, options, Progress.new(options.plan), done)
    await unit.start()
    bus.units.append(unit)
    await service.start()
    try:
        await eventually(lambda: service.job.waiting == "no queuemaster is running")
        await routed_on_osm(bus.url, b'{"command": "reticulate splines"}')
        client = await bus.client()
        await client.alert("toposm", {"command": "reticulate splines"})  # its unit started: bound already
        await eventually(lambda: service.all_programs.heard["other"] == 2)
        assert not done.is_set()
        bus.queuemaster()
        bus.renderer()
        await asyncio.wait_for(done.wait(), HANG)
        assert service.job.progress.complete and service.all_programs.heard["queuemaster online"] >= 1
    finally:
        await service.stop()
