"""The PostGIS production path end to end, as osm2pgsql/renderd operators run it, on the real Helsinki extract:
``toposm-import --postgis``, a real diff through ``toposm-replicate --postgis`` alone (no embedded store, no
Spark bridge: osm2pgsql's own expiry published on both wires), the queuemaster re-rendering the expired
metatile with a Mapnik renderer drawing from PostGIS; from a replication server over HTTP, an osm2pgsql
failure backed off and retried; and the same path with a flat-nodes file."""

# ruff: noqa: F811 - the fixtures are imported by name and then requested as parameters
from __future__ import annotations

import asyncio
import io
import os
import subprocess
from pathlib import Path

import aio_pika
import mercantile
import structlog
from PIL import Image, ImageChops

from demo.osm_changes import helsinki_edit
from demo.osm_changes import publish as publish_demo
from harness import HANG, eventually
from harness.osm import node_xml, osc, publish, read_extract, renumber, street_node
from services.osmstore.importer import main as toposm_import
from services.osmstore.postgis import import_postgis, postgis_sequence, psql
from services.replicate.follower import Follower, FollowSettings
from services.replicate.postgis_expiry import PENDING
from services.toposm.contract import EXPIRE_TOPIC
from services.toposm.expiry_wires import on_both_wires
from services.toposm.seed_wire import declare_osm_exchange
from services.toposm.tile_store import TileStore
from services.toposm.tilemath import Tile
from tests.services.osmstore.conftest import helsinki, osm_data, postgis_dsn  # noqa: F401
from tests.services.spark_bridge.replication_server import serving

from .conftest import BIN, TileBus, alert_listener, wait_renderers

TILE_PX = 256
MIN_Z, MAX_Z = 14, 17


def fresh_import(helsinki: Path, dsn: str) -> None:
    """The extract into PostGIS, with no replication sequence yet (the module's tests share the database)."""
    import_postgis(helsinki, dsn)
    psql(dsn, "DROP TABLE IF EXISTS planet_osm_replication_status")


def pixel_box(tile: Tile, west: float, south: float, east: float, north: float) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) pixels of a lon/lat box in ``tile``'s 256 px image."""
    b = mercantile.xy_bounds(tile.x, tile.y, tile.z)
    (x0, y0), (x1, y1) = mercantile.xy(west, north), mercantile.xy(east, south)
    scale = TILE_PX / (b.right - b.left)
    return (
        int((x0 - b.left) * scale),
        int((b.top - y0) * scale),
        int((x1 - b.left) * scale) + 1,
        int((b.top - y1) * scale) + 1,
    )


async def osm_wire_listener(url: str) -> tuple[aio_pika.abc.AbstractConnection, list[tuple[str, str | None]]]:
    """(connection, [(body, message id)]) of what is published on the seed's ``osm`` wire as expire_toposm."""
    heard: list[tuple[str, str | None]] = []
    connection = await aio_pika.connect(url)
    channel, exchange = await declare_osm_exchange(connection)
    queue = await channel.declare_queue(exclusive=True)
    await queue.bind(exchange, EXPIRE_TOPIC)

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        heard.append((message.body.decode(), message.message_id))
        await message.ack()

    await queue.consume(on_message)
    return connection, heard


async def test_postgis_alone_diff_expired_on_both_wires_and_rerendered(
    bus: TileBus, postgis_dsn, helsinki, tmp_path
) -> None:
    fresh_import(helsinki, postgis_dsn)
    edit = helsinki_edit(helsinki)  # Mikonkatu renamed, a building corner moved, "Qbroker House" built
    lon, lat = edit.centre
    # The new building's square (demo/osm_changes.py), and the z17 tile it is in.
    west, south, east, north = lon + 0.0006, lat + 0.0003, lon + 0.00096, lat + 0.000435
    t = mercantile.tile((west + east) / 2, (south + north) / 2, MAX_Z)
    tile = Tile(MAX_Z, t.x, t.y)

    bus.queuemaster()
    bus.renderer("--store", postgis_dsn, backend="mapnik")  # Mapnik's postgis datasource
    client = await bus.client()
    await wait_renderers(client, 1, timeout=HANG)
    await client.call("toposm.queuemaster", {"command": "render", "tile": str(tile)}, timeout=2 * HANG)
    tiles = TileStore(bus.tile_root)
    before = tiles.path(tile).read_bytes()

    on_alert = await alert_listener(bus, EXPIRE_TOPIC)
    osm_connection, on_osm = await osm_wire_listener(bus.url)
    try:
        source = tmp_path / "replication"
        publish_demo(source, 1, edit.text, "2026-11-24T00:01:00Z")
        spool = tmp_path / "spool"
        replicate = subprocess.run(
            [
                str(BIN / "toposm-replicate"),
                "--source",
                str(source),
                "--postgis",
                postgis_dsn,
                "--spool",
                str(spool),
                "--start",
                "1",
                "--once",
                "--min-zoom",
                str(MIN_Z),
                "--max-zoom",
                str(MAX_Z),
            ],
            env={**os.environ, "QBROKER_URL": bus.url},
            capture_output=True,
            text=True,
            timeout=2 * HANG,
        )
        assert replicate.returncode == 0, replicate.stderr[-3000:]
        assert postgis_sequence(postgis_dsn) == 1
        assert (
            psql(postgis_dsn, f"SELECT name FROM planet_osm_polygon WHERE osm_id = {edit.new_building}")
            == "Qbroker House"
        )
        assert not (spool / PENDING).exists()  # published, then removed

        # Heard on both wires, once each, the same list under one marked message id.
        await eventually(lambda: on_alert and on_osm)
        published = {item for body in on_alert for item in body.split(";")}
        origin = f"{MAX_Z}/{tile.x >> 3 << 3}/{tile.y >> 3 << 3}"
        assert origin in published
        assert {int(item.split("/")[0]) for item in published} == set(range(MIN_Z, MAX_Z + 1))
        assert sorted(body for body, _ in on_osm) == sorted(on_alert)
        assert all(on_both_wires(message_id) for _, message_id in on_osm)
    finally:
        await osm_connection.close()

    # The queuemaster heard it and the renderer drew the metatile again from PostGIS: the new building shows.
    await eventually(lambda: tiles.path(tile).read_bytes() != before, timeout=2 * HANG)
    old = Image.open(io.BytesIO(before)).convert("RGB")
    new = Image.open(io.BytesIO(tiles.path(tile).read_bytes())).convert("RGB")
    left, top, right, bottom = pixel_box(tile, west, south, east, north)
    changed = ImageChops.difference(old, new).crop(
        (max(left, 0), max(top, 0), min(right, TILE_PX), min(bottom, TILE_PX))
    )
    area = changed.width * changed.height
    differing = sum(1 for px in changed.get_flattened_data() if px != (0, 0, 0))
    # Its fill, outline and label: 47% of its box's pixels changed when this was written (labels elsewhere in
    # the tile move too, so the whole tile is no measure).
    assert area > 0 and differing > area // 4, f"{differing} of {area} pixels changed where the building is"


async def test_osm2pgsql_failure_backs_off_and_keeps_the_sequence(make_unit, postgis_dsn, helsinki, tmp_path) -> None:
    fresh_import(helsinki, postgis_dsn)
    mirror = tmp_path / "mirror"
    publish_demo(mirror / "replication" / "minute", 1, helsinki_edit(helsinki).text, "2026-11-24T00:01:00Z")
    heard: list[str] = []
    listener = await make_unit("test.postgis.listener")

    @listener.on_alert(EXPIRE_TOPIC)
    async def on_expire(body: str) -> None:
        heard.append(body)

    await listener.start()
    # osm2pgsql --append fails for real: its ways table is not there.
    psql(postgis_dsn, "ALTER TABLE planet_osm_ways RENAME TO planet_osm_ways_away")
    with serving(mirror) as server, structlog.testing.capture_logs() as logs:
        settings = FollowSettings(
            source=server.url + "replication/minute/",
            store=None,
            store_name="postgis",
            postgis=postgis_dsn,
            spool=tmp_path / "spool",
            start=1,
            interval=0.05,
            max_backoff=0.2,
            min_zoom=MIN_Z,
            max_zoom=MAX_Z,
            http_retries=0,
        )
        follower = Follower(await make_unit("toposm.replicate"), settings)
        registry = follower.metrics_server.registry
        await follower.unit.start()
        await follower.start()
        try:
            await eventually(lambda: follower.failures >= 3)
            assert postgis_sequence(postgis_dsn) is None  # the state is where it was
            assert registry.get_sample_value("toposm_replicate_failures_total", {"what": "postgis"}) >= 3
            assert registry.get_sample_value("toposm_replicate_failures_in_a_row") >= 1
            warned = [e for e in logs if e["event"] == "postgis unavailable; backing off"]
            assert warned and "osm2pgsql failed" in warned[0]["error"]
            assert warned[0]["retry_in"] <= settings.max_backoff
            assert not heard  # nothing published for a diff the store does not hold

            psql(postgis_dsn, "ALTER TABLE planet_osm_ways_away RENAME TO planet_osm_ways")
            await eventually(lambda: postgis_sequence(postgis_dsn) == 1)
            await eventually(lambda: heard)
            await eventually(lambda: registry.get_sample_value("toposm_replicate_failures_in_a_row") == 0)
        finally:
            await asyncio.wait_for(follower.stop(), HANG)
        assert ("/replication/minute/000/000/001.osc.gz", "200") in server.log
    assert follower.error is None and follower.applied == [1]
    assert registry.get_sample_value("toposm_replicate_sequence", {"store": "postgis"}) == 1
    assert registry.get_sample_value("toposm_replicate_expired_metatiles_total") == len(
        {item for body in heard for item in body.split(";")}
    )
    assert not (tmp_path / "spool" / PENDING).exists()


def origin(lon: float, lat: float, z: int) -> str:
    """The metatile origin (top-left tile) the expiry names for a point."""
    t = mercantile.tile(lon, lat, z)
    return f"{z}/{t.x >> 3 << 3}/{t.y >> 3 << 3}"


async def test_postgis_alone_with_flat_nodes(make_unit, postgis_dsn, helsinki, tmp_path) -> None:
    compact = tmp_path / "helsinki-compact.osm.pbf"
    node_ids = renumber(helsinki, compact)  # a flat-nodes file for today's ids would be ~48 GB
    flat = tmp_path / "nodes.flat"
    toposm_import([str(compact), "--postgis", postgis_dsn, "--flat-nodes", str(flat)])
    psql(postgis_dsn, "DROP TABLE IF EXISTS planet_osm_replication_status")
    node, lon, lat = street_node(read_extract(helsinki))
    # Only the node moves: osm2pgsql finds its ways, and their other nodes' locations in the flat file.
    publish(tmp_path / "replication", 1, osc(modify=[node_xml(node_ids[node], lon + 0.002, lat, version=90)]))
    heard: list[str] = []
    listener = await make_unit("test.postgis.flat.listener")

    @listener.on_alert(EXPIRE_TOPIC)
    async def on_expire(body: str) -> None:
        heard.append(body)

    await listener.start()
    settings = FollowSettings(
        source=tmp_path / "replication",
        store=None,
        store_name="postgis",
        postgis=postgis_dsn,
        spool=tmp_path / "spool",
        start=1,
        min_zoom=MIN_Z,
        max_zoom=MAX_Z,
        flat_nodes=flat,
        expire_output=tmp_path / "operator.tiles",
    )
    follower = Follower(await make_unit("toposm.replicate"), settings)
    await follower.unit.start()
    assert await follower.catch_up() == [1]
    assert postgis_sequence(postgis_dsn) == 1
    await eventually(lambda: heard)
    published = {item for body in heard for item in body.split(";")}
    # Where the node was and where it is (the way's old and new line), at the highest zoom.
    assert {origin(lon, lat, MAX_Z), origin(lon + 0.002, lat, MAX_Z)} <= published
    # The operator's copy is osm2pgsql's own list: every tile of it lies in a published metatile.
    copied = (tmp_path / "operator.tiles").read_text().split()
    assert (
        copied
        and {f"{z}/{int(x) >> 3 << 3}/{int(y) >> 3 << 3}" for z, x, y in (c.split("/") for c in copied)} == published
    )
