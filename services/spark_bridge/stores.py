"""The stores a bridge may expire against and update: only those given on its command line.

A request names a store (``"store": "helsinki"``); the name is looked up here, never used as a path, so
a request cannot make the bridge read or write any directory the operator did not configure with
``--store DIR``. The name of a store is its directory's name; the full path given at start works too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from services.osmstore.geometry import GEOMETRY_DIR, GeometryStore, GeometryStoreError
from services.spark_bridge.expire_inputs import ExpireInput, InputKind
from services.spark_bridge.models import ExpireRequest
from services.spark_bridge.sea_refresh import SeaRefresher
from services.spark_bridge.store_job import StoreJob
from services.spark_bridge.store_lookup import DRIVER_LOOKUP_BYTES
from services.toposm.error_messages import failed


class UnknownStore(LookupError):
    """A request named a store the bridge was not configured with."""


@dataclass(frozen=True)
class Stores:
    by_name: dict[str, Path]
    driver_lookup_bytes: int = DRIVER_LOOKUP_BYTES  # see store_lookup
    # One GeometryStore per store for the bridge's life: its writer connection and background
    # checkpoints outlive the jobs (geometry.GeometryStore.writer).
    geometry: dict[Path, GeometryStore] = field(default_factory=dict)
    sea: dict[Path, SeaRefresher] = field(default_factory=dict)  # one background sea refresh per store

    @classmethod
    def of(cls, dirs: Sequence[Path], driver_lookup_bytes: int = DRIVER_LOOKUP_BYTES) -> Stores:
        """Validate every ``--store`` at start (a geometry store must be there); raises ValueError."""
        by_name: dict[str, Path] = {}
        geometry: dict[Path, GeometryStore] = {}
        for given in dirs:
            path = Path(given).resolve()
            try:
                geometry[path] = GeometryStore(path / GEOMETRY_DIR, keep_writer=True)
                geometry[path].manifest()
            except GeometryStoreError as exc:
                raise ValueError(f"--store {given}: {exc}") from None
            if path.name in by_name and by_name[path.name] != path:
                raise ValueError(f"--store {given}: another store is already named {path.name!r}")
            by_name[path.name] = path
            by_name[str(given)] = path
            by_name[str(path)] = path
        if driver_lookup_bytes < 0:
            raise ValueError("driver_lookup_bytes must not be negative")
        return cls(by_name, driver_lookup_bytes, geometry, {path: SeaRefresher(path) for path in geometry})

    def get(self, name: str) -> Path:
        try:
            return self.by_name[name]
        except KeyError:
            known = sorted({p.name for p in self.by_name.values()})
            raise UnknownStore(f"no store {name[:200]!r} on this bridge (configured: {known or 'none'})") from None

    def close(self) -> None:
        for sea in self.sea.values():
            sea.close()
        for store in self.geometry.values():
            store.close()


def store_job_for(stores: Stores, request: ExpireRequest, inputs: list[ExpireInput]) -> StoreJob | None:
    """The store part of an expire request, or None without ``store``. Raises RequestFailed."""
    if request.store is None:
        return None
    try:
        store_dir = stores.get(request.store)
    except UnknownStore as exc:
        raise failed("unknown_store", str(exc)) from None
    if len(inputs) != 1 or inputs[0].kind is not InputKind.OSC:
        raise failed("bad_input", "with store, paths must name exactly one osmChange file (.osc or .osc.gz)")
    return StoreJob(
        store_dir=store_dir,
        sequence=request.sequence,
        apply=request.apply,
        driver_lookup_bytes=stores.driver_lookup_bytes,
        first_sequence=request.first_sequence,
        geometry=stores.geometry[store_dir],
        sea=stores.sea[store_dir],
    )
