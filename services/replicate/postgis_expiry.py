"""osm2pgsql's own expiry on the bus: ``toposm-replicate --postgis DSN`` with no embedded store.

Without the embedded store there is no Spark bridge job to expire tiles, so the expiry is osm2pgsql's, as
renderd's operators run it (``osm2pgsql --append --expire-tiles Z0-Z1 --expire-output FILE``, then
``render_expired`` on FILE): every tile from ``--min-zoom`` to ``--max-zoom`` whose old or new geometry a
diff touched. Here FILE is ``PENDING`` in the follower's spool, and instead of ``render_expired`` its tiles
are reduced to their metatiles and published as the ``expire_toposm`` alert on both wires
(``expiry_wires.publish_expiry``, in ``ExpirationBatcher``'s capped lists, metatile origins ``z/x/y`` as the
bridge publishes them), where the queuemaster re-renders those it has drawn.

Order, per batch (``sinks.PostgisStore``): osm2pgsql appends to the pending file -> its metatiles are
published -> the store's sequence is recorded -> the file goes (appended to ``--expire-output`` first, when
the operator asked for a copy). A follower stopped anywhere in between finds the file on restart: the same
diffs are applied again (the sequence was not recorded) and osm2pgsql appends to it, so what the first run
expired (the old geometry's tiles included) is published with the second. At least once, never lost.
Nothing in a message chooses a path here: the file's place is the operator's ``--spool``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import structlog

from qbroker import Unit
from services.osmstore.postgis import ExpireOutput
from services.toposm.contract import METATILE_SHIFT
from services.toposm.expiry_wires import ExpirationBatcher, OsmPublisher, publish_expiry
from services.toposm.tilemath import ZoomRange, parse_tile_list

log = structlog.get_logger("toposm.replicate")

PENDING = "osm2pgsql-expired.tiles"  # in the spool; clear_spool leaves it (its name is not a batch's)


class PostgisExpiry:
    """Publishes what osm2pgsql expired. Built before ``unit.start()`` (it declares ``osm`` on each connect)."""

    def __init__(self, unit: Unit, spool: Path, zooms: ZoomRange, *, copy_to: Path | None = None) -> None:
        self.unit = unit
        self.zooms = zooms
        self.pending = spool / PENDING
        self.copy_to = copy_to
        self._osm = OsmPublisher()
        unit.on_connected(self._osm.declare)

    def output(self) -> ExpireOutput:
        return ExpireOutput(self.zooms.min_zoom, self.zooms.max_zoom, self.pending)

    def metatiles(self) -> tuple[int, list[str]]:
        """(tiles osm2pgsql listed, the origins of their metatiles in (z, x, y) order)."""
        try:
            text = self.pending.read_text()
        except FileNotFoundError:  # osm2pgsql writes no file when a diff expires nothing
            return 0, []
        tiles, problems = parse_tile_list(text, self.zooms)
        if problems:  # osm2pgsql wrote it with our zooms: a problem here is a truncated last line at most
            log.warning("osm2pgsql expiry: lines skipped", count=len(problems), first=problems[0][:200])
        metas = sorted({t.metatile for t in tiles})
        return len(tiles), [f"{m.z}/{m.mx << METATILE_SHIFT}/{m.my << METATILE_SHIFT}" for m in metas]

    async def publish(self) -> dict[str, int]:
        """Publish the pending metatiles on both wires; QBrokerError when the bus does not take them."""
        tiles, origins = await asyncio.to_thread(self.metatiles)
        lists: list[str] = []
        batcher = ExpirationBatcher(lists.append)
        for origin in origins:
            batcher.add(origin)
        batcher.flush()
        for text in lists:
            await publish_expiry(self.unit, self._osm, text)
        return {"tiles": tiles, "metatiles": len(origins), "messages": len(lists)}

    def done(self) -> None:
        """After the sequence is recorded: the operator's copy (``--expire-output``), then the file goes."""
        if not self.pending.is_file():
            return
        if self.copy_to is not None:
            with self.copy_to.open("a") as out:
                out.write(self.pending.read_text())
        self.pending.unlink()
