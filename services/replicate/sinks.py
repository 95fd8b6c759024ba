"""The stores a follower keeps current, each with its own record of progress.

- ``EmbeddedStore``: the store directory of ``toposm-import --store``, updated through the Spark bridge
  (``spark.expire`` with ``store``: expiry from the old geometry, rendering store, geometry store); its
  geometry store's sequence is its progress. A merged batch goes as one job (``first_sequence``..``sequence``).
- ``PostgisStore``: a PostGIS database of ``toposm-import --postgis``, updated with
  ``osm2pgsql --append --slim`` (the same merged file); its progress is osm2pgsql-replication's
  ``planet_osm_replication_status`` row, written after osm2pgsql committed. A crash in between applies the
  batch again on restart, which osm2pgsql tolerates (its own replication script relies on it). Alone (no
  embedded store, so no bridge to expire tiles) it publishes osm2pgsql's own expiry before recording the
  sequence (``postgis_expiry``). osm2pgsql failing (``StoreUnavailable``) is retried by the follower.
"""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from qbroker import RequestFailed, Unit
from services.osmstore.errors import ImportFailed, StoreUnavailable
from services.osmstore.geometry import GeometryStore, GeometryStoreError
from services.osmstore.postgis import ExpireOutput, append_postgis, postgis_sequence, record_postgis_sequence
from services.osmstore.render_db import RENDER_DB
from services.osmstore.replication import ReplicationError
from services.toposm.contract import SPARK_EXPIRE

from .batch import Batch
from .postgis_expiry import PostgisExpiry


class Sink(Protocol):
    name: str

    def position(self) -> int | None: ...  # the last sequence applied; None: none yet (blocking: run in a thread)

    async def apply(self, batch: Batch) -> dict[str, Any]: ...  # raises ReplicationError; QBrokerError: retry


@dataclass(frozen=True)
class BridgeCall:
    store_name: str
    min_zoom: int
    max_zoom: int
    timeout: float


class EmbeddedStore:
    name = "store"

    def __init__(self, unit: Unit, store: Path, call: BridgeCall) -> None:
        self.unit, self.store, self.call = unit, store, call

    def position(self) -> int | None:
        try:
            return GeometryStore.of_store(self.store).sequence
        except GeometryStoreError as exc:
            raise ReplicationError(str(exc)) from None

    def render_position(self) -> int | None:
        """The rendering store's sequence: ahead of the geometry store's only after a crash between the two."""
        path = self.store / RENDER_DB
        if not path.is_file():
            return None
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'sequence'").fetchone()
        return int(row[0]) if row and str(row[0]).isdigit() else None

    async def apply(self, batch: Batch) -> dict[str, Any]:
        request: dict[str, Any] = {
            "paths": [str(batch.path)],
            "store": self.call.store_name,
            "sequence": batch.last,
            "min_zoom": self.call.min_zoom,
            "max_zoom": self.call.max_zoom,
            "wait": True,
        }
        if batch.first != batch.last:
            request["first_sequence"] = batch.first
        try:
            reply = await self.unit.call(SPARK_EXPIRE, request, timeout=self.call.timeout)
        except RequestFailed as exc:  # the bridge refused or the job failed: the diffs are not applied
            raise ReplicationError(f"{_diffs(batch)}: {exc}") from None
        result = dict(reply.get("result") or {})
        store = result.get("store") or {}
        if not store.get("applied") and "replay" not in store:
            raise ReplicationError(f"{_diffs(batch)}: the bridge did not apply it ({store})")
        return result


class PostgisStore:
    name = "postgis"

    def __init__(
        self,
        dsn: str,
        source_url: str,
        *,
        flat_nodes: Path | None = None,
        expire: ExpireOutput | None = None,
        publish: PostgisExpiry | None = None,
    ) -> None:
        self.dsn, self.source_url, self.flat_nodes = dsn, source_url, flat_nodes
        self.publish = publish  # alone: osm2pgsql's expiry goes on the bus, through a file of the spool
        self.expire = publish.output() if publish is not None else expire

    def position(self) -> int | None:
        try:
            return postgis_sequence(self.dsn)
        except StoreUnavailable as exc:  # the database is down or refuses: the follower backs off
            raise StoreUnavailable(f"PostGIS: {exc}") from None
        except ImportFailed as exc:
            raise ReplicationError(f"PostGIS: {exc}") from None

    async def apply(self, batch: Batch) -> dict[str, Any]:
        result: dict[str, Any] = {"sequence": batch.last}
        try:
            await asyncio.to_thread(
                append_postgis, batch.path, self.dsn, flat_nodes=self.flat_nodes, expire=self.expire
            )
            if self.publish is not None:  # QBrokerError: the follower backs off, osm2pgsql runs again
                result["expired"] = await self.publish.publish()
            await asyncio.to_thread(record_postgis_sequence, self.dsn, self.source_url, batch.last, batch.timestamp)
        except StoreUnavailable as exc:
            raise StoreUnavailable(f"PostGIS, {_diffs(batch)}: {exc}") from None
        except ImportFailed as exc:
            raise ReplicationError(f"PostGIS, {_diffs(batch)}: {exc}") from None
        if self.publish is not None:
            await asyncio.to_thread(self.publish.done)
        return result


def _diffs(batch: Batch) -> str:
    return (
        f"diff {batch.first} ({batch.path.name})"
        if batch.first == batch.last
        else f"diffs {batch.first}..{batch.last} ({batch.path.name})"
    )
