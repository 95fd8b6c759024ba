"""Queuemaster and a ``toposm-renderer --store`` on real RabbitMQ render real Helsinki data, and re-render
a street renamed by an osmChange applied to the store."""

from pathlib import Path

import mercantile

from harness import eventually
from harness.osm import osc, read_extract, way_xml, write_osc
from services.osmstore.importer import import_extract
from services.osmstore.render_store import apply_osc
from services.toposm.tile_store import TileStore
from services.toposm.tilemath import Tile
from tests.services.osmstore.conftest import helsinki, osm_data  # noqa: F401 - session fixtures

from .conftest import wait_renderers


async def test_renderer_store_renders_real_data_and_a_diff(bus, tmp_path: Path, helsinki: Path):  # noqa: F811
    extract_path = helsinki
    store = tmp_path / "helsinki"
    import_extract(extract_path, store)
    extract = read_extract(extract_path)
    streets = {
        wid: (refs, tags)
        for wid, (refs, tags) in extract.ways.items()
        if tags.get("name") == "Mikonkatu" and tags.get("highway") == "unclassified"
    }
    refs = max((refs for refs, _ in streets.values()), key=len)
    lon, lat = extract.nodes[refs[len(refs) // 2]]
    t = mercantile.tile(lon, lat, 17)
    tile = Tile(17, t.x, t.y)

    bus.queuemaster()
    bus.renderer("--store", str(store), backend="mapnik")
    client = await bus.client()
    await wait_renderers(client, 1, timeout=60)
    reply = await client.call("toposm.queuemaster", {"command": "render", "tile": str(tile)}, timeout=120)
    assert reply["metatile"] == str(tile.metatile)
    tiles = TileStore(bus.tile_root)
    before = tiles.path(tile).read_bytes()

    diff = osc(modify=[way_xml(wid, r, {**tags, "name": "Qbrokerinkatu"}) for wid, (r, tags) in streets.items()])
    assert apply_osc(store, write_osc(tmp_path / "rename.osc", diff))["ways_modified"] == len(streets)
    await client.alert("expire_toposm", str(tile), content_type="text/plain")

    async def rerendered() -> bool:
        await client.call("toposm.queuemaster", {"command": "render", "tile": str(tile)}, timeout=120)
        return tiles.path(tile).read_bytes() != before

    await eventually(rerendered, timeout=120)
