"""``toposm-queuemaster``: run the TopOSM queuemaster."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

from pydantic import model_validator

from qbroker import Unit
from qbroker.runner import serve
from qbroker.settings import option, shared
from services.toposm.settings import StackSettings, UserList, check_zooms, stack_option
from services.toposm.tile_store import TileStoreKind, check_tile_store_zoom
from services.toposm.tilemath import ZoomRange

from .access import AccessPolicy
from .buckets import BucketLimits
from .service import APP, QueuemasterService
from .settings import DEFAULT_DEADLINE, DRAIN_TIMEOUT, MAX_WAITS, MAX_WAITS_PER_ACCOUNT, QueuemasterSettings
from .state_machine import Queuemaster


class QueuemasterOptions(StackSettings):
    prog = "toposm-queuemaster"
    description = __doc__

    tile_root: Path = stack_option("tile_root")
    tile_store: TileStoreKind = stack_option("tile_store")
    state_file: Path = option(Path("toposm-queue.sqlite"), "SQLite file persisting the queue", metavar="FILE")
    min_zoom: int = stack_option("min_zoom")
    max_zoom: int = stack_option("max_zoom")
    render_log: Path | None = stack_option("render_log", help="append one JSON line per finished render")
    render_missing_expired: bool = option(False, "also render expired metatiles that were never rendered")
    propagate_to_zoom: int | None = option(
        None, "expire ancestors of expired metatiles down to this zoom", metavar="Z", default_text="none"
    )
    seed: int | None = option(None, "seed the strategy RNG (reproducible picks)", metavar="N", default_text="random")
    ping_interval: float = option(
        1.0,
        "seconds between liveness checks of each render thread (qbroker threads "
        "are pinged; an osm-wire thread's queue is asked of the broker)",
        gt=0,
    )
    ping_misses: int = option(3, "missed checks in a row before a render thread is dead", ge=1)
    renderer_users: UserList = option(
        frozenset(),
        "broker accounts of renderers (comma-separated): only they may "
        "register, report and unregister threads, each only its own. Empty: no "
        "checks (development)",
        metavar="USERS",
    )
    expire_users: UserList = option(
        frozenset(), "accounts that may send `expire`; empty: anyone who may call", metavar="USERS"
    )
    bulk_users: UserList = option(
        frozenset(),
        "accounts that may pre-render with toposm-render-list (`bulk`, `cancel`); empty: anyone who may call",
        metavar="USERS",
    )
    max_background_threads: int | None = option(
        None,
        "render threads that may render background work (expired and bulk) at once, like Tirex's bucket "
        "maxproc; the others wait for on-demand requests",
        metavar="N",
        default_text="no limit",
    )
    max_bulk_threads: int | None = option(
        None, "render threads that may pre-render (toposm-render-list) at once", metavar="N", default_text="no limit"
    )
    max_waits: int = option(
        MAX_WAITS,
        "render and bulk requests waiting at once; beyond, a new one is answered busy: bounds the queuemaster's memory",
        metavar="N",
        gt=0,
    )
    max_waits_per_account: int = option(
        MAX_WAITS_PER_ACCOUNT,
        "requests one account (its broker-validated user-id) may have waiting at once, "
        "below --max-waits: one account never gets another refused",
        metavar="N",
        gt=0,
    )
    default_deadline: float = option(
        DEFAULT_DEADLINE,
        "a render or bulk request that carries no deadline (the osm wire) is answered "
        "render_timeout after this many seconds if its metatile is not rendered by then",
        metavar="S",
        gt=0,
    )
    # On SIGTERM: waiting requests answered queuemaster_stopped for up to half of it (the rest kept for the next
    # run), handlers let finish until the end of it, then what still runs is abandoned.
    drain_timeout: float = shared(StackSettings, "drain_timeout", DRAIN_TIMEOUT)

    @model_validator(mode="after")
    def _consistent(self) -> QueuemasterOptions:
        check_tile_store_zoom(self.tile_store, self.max_zoom)
        check_zooms(self.min_zoom, self.max_zoom)
        self.queuemaster_settings()  # its own checks (the caps), read as usage errors
        return self

    def queuemaster_settings(self) -> QueuemasterSettings:
        return QueuemasterSettings(
            tile_root=self.tile_root,
            tile_store=self.tile_store,
            state_file=self.state_file,
            zooms=ZoomRange(self.min_zoom, self.max_zoom),
            render_log=self.render_log,
            render_missing_expired=self.render_missing_expired,
            propagate_to_zoom=self.propagate_to_zoom,
            seed=self.seed,
            ping_interval=self.ping_interval,
            ping_misses=self.ping_misses,
            metrics_port=self.metrics_port,
            metrics_host=self.metrics_host,
            buckets=BucketLimits(background=self.max_background_threads, bulk=self.max_bulk_threads),
            access=AccessPolicy(
                renderers=self.renderer_users or None, expirers=self.expire_users or None, bulk=self.bulk_users or None
            ),
            max_waits=self.max_waits,
            max_waits_per_account=self.max_waits_per_account,
            default_deadline=self.default_deadline,
            drain_timeout=self.drain_timeout,
        )


def parse_args(argv: list[str] | None = None) -> QueuemasterSettings:
    return QueuemasterOptions.parse(argv).queuemaster_settings()


def main(argv: list[str] | None = None) -> None:
    options = QueuemasterOptions.parse(argv)
    # The state machine outlives the unit: handlers still draining after stop() write to its store.
    services: list[QueuemasterService] = []
    with closing(Queuemaster(options.queuemaster_settings())) as qm:

        def make_service(unit: Unit) -> QueuemasterService:
            services.append(QueuemasterService(unit, qm))
            return services[-1]

        try:
            serve(APP, make_service, settings=options)
        finally:
            for service in services:  # the rows of the requests answered last are deleted too
                service.waiter_store.close()


if __name__ == "__main__":
    main()
