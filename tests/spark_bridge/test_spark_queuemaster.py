"""Expirations published by the bridge are taken up by the real TopOSM queuemaster."""

from __future__ import annotations

from harness import eventually
from qbroker import Config, Unit
from services.tiles.queuemaster.service import APP, QueuemasterService
from services.tiles.queuemaster.state_machine import Queuemaster, QueuemasterSettings
from services.toposm.tilemath import ZoomRange


async def test_queuemaster_queues_published_metatiles(bridge, client, amqp_url, tmp_path) -> None:
    settings = QueuemasterSettings(
        tile_root=tmp_path / "tiles",
        state_file=tmp_path / "queue.sqlite",
        zooms=ZoomRange(10, 14),
        render_missing_expired=True,  # nothing is rendered yet: queue every expired metatile
    )
    qm = Queuemaster(settings)
    unit = Unit(APP, config=Config(url=amqp_url))
    queuemaster = QueuemasterService(unit, qm)
    await unit.start()
    await queuemaster.start()
    try:
        listing = tmp_path / "expire.list"
        # Two z16 tiles 100 columns apart (different metatiles down to z11, the same one at z10).
        listing.write_text("16/34000/22000\n16/34100/22000\n")
        reply = await client.call(
            "spark.expire", {"paths": [str(listing)], "min_zoom": 10, "max_zoom": 14, "wait": True}, timeout=120
        )
        result = reply["result"]
        assert result["metatiles_per_zoom"] == {"10": 1, "11": 2, "12": 2, "13": 2, "14": 2}
        assert result["published"]["metatiles"] == 9

        async def queued() -> int:
            stats = await client.call("toposm.queuemaster", {"command": "stats"})
            return stats["queues"]["total"] == 9 and stats["queues"]["by_zoom"]

        by_zoom = await eventually(queued, timeout=30)
        assert by_zoom == {"10": 1, "11": 2, "12": 2, "13": 2, "14": 2}
    finally:
        await queuemaster.stop()
        await unit.stop()
        qm.close()
