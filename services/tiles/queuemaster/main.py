"""``toposm-queuemaster``: run the TopOSM queuemaster (broker from QBROKER_URL)."""

from __future__ import annotations

import argparse
from contextlib import closing
from pathlib import Path

from qbroker import Unit
from qbroker.metrics_port import add_metrics_options, check_metrics_options
from qbroker.runner import serve

from ..tile_store import add_tile_store_option, check_tile_store_zoom
from ..tilemath import ZoomRange
from .access import AccessPolicy
from .buckets import BucketLimits
from .service import APP, QueuemasterService
from .settings import DEFAULT_DEADLINE, DRAIN_TIMEOUT, MAX_WAITS, MAX_WAITS_PER_ACCOUNT, QueuemasterSettings
from .state_machine import Queuemaster


def parse_args(argv: list[str] | None = None) -> QueuemasterSettings:
    p = argparse.ArgumentParser(prog="toposm-queuemaster", description=__doc__)
    p.add_argument("--tile-root", type=Path, default=Path("tiles"), help="tile store root (<root>/z/x/y.png)")
    add_tile_store_option(p)
    p.add_argument("--state-file", type=Path, default=Path("toposm-queue.sqlite"),
                   help="SQLite file persisting the queue")
    p.add_argument("--min-zoom", type=int, default=0)
    p.add_argument("--max-zoom", type=int, default=18)
    p.add_argument("--render-log", type=Path, default=None, help="append one JSON line per finished render")
    p.add_argument("--render-missing-expired", action="store_true",
                   help="also render expired metatiles that were never rendered")
    p.add_argument("--propagate-to-zoom", type=int, default=None,
                   help="expire ancestors of expired metatiles down to this zoom")
    p.add_argument("--seed", type=int, default=None, help="seed the strategy RNG (reproducible picks)")
    p.add_argument("--ping-interval", type=float, default=1.0,
                   help="seconds between liveness checks of each render thread "
                   "(qbroker threads are pinged; a seed-wire thread's queue is asked of the broker)")
    p.add_argument("--ping-misses", type=int, default=3, help="missed checks in a row before a render thread is dead")
    env = AccessPolicy.from_env()
    p.add_argument("--renderer-users", default=",".join(sorted(env.renderers or ())),
                   help="broker accounts of renderers (comma-separated; env TOPOSM_RENDERER_USERS): only they may "
                   "register, report and unregister threads, each only its own. Empty: no checks (development)")
    p.add_argument("--expire-users", default=",".join(sorted(env.expirers or ())),
                   help="accounts that may send `expire` (env TOPOSM_EXPIRE_USERS); empty: anyone who may call")
    p.add_argument("--bulk-users", default=",".join(sorted(env.bulk or ())),
                   help="accounts that may pre-render with toposm-render-list (`bulk`, `cancel`; env "
                   "TOPOSM_BULK_USERS); empty: anyone who may call")
    p.add_argument("--max-background-threads", type=int, default=None, metavar="N",
                   help="render threads that may render background work (expired and bulk) at once, like "
                   "Tirex's bucket maxproc; the others wait for on-demand requests (default: no limit)")
    p.add_argument("--max-bulk-threads", type=int, default=None, metavar="N",
                   help="render threads that may pre-render (toposm-render-list) at once (default: no limit)")
    p.add_argument("--max-waits", type=int, default=MAX_WAITS, metavar="N",
                   help=f"render and bulk requests waiting at once; beyond, a new one is answered busy: bounds the "
                   f"queuemaster's memory (default {MAX_WAITS})")
    p.add_argument("--max-waits-per-account", type=int, default=MAX_WAITS_PER_ACCOUNT, metavar="N",
                   help="requests one account (its broker-validated user-id) may have waiting at once, below "
                   f"--max-waits: one account never gets another refused (default {MAX_WAITS_PER_ACCOUNT})")
    p.add_argument("--default-deadline", type=float, default=DEFAULT_DEADLINE, metavar="S",
                   help="a render or bulk request that carries no deadline (the seed's osm wire) is answered "
                   "render_timeout after S seconds if its metatile is not rendered by then "
                   f"(default {DEFAULT_DEADLINE:g})")
    p.add_argument("--drain-timeout", type=float, default=DRAIN_TIMEOUT, metavar="S",
                   help="on SIGTERM: answer waiting requests queuemaster_stopped for up to S/2 seconds (the rest "
                   "are kept for the next run), let handlers finish until S, then abandon what still runs and exit "
                   f"(default {DRAIN_TIMEOUT:g})")
    add_metrics_options(p)
    a = p.parse_args(argv)
    check_metrics_options(p, a)
    check_tile_store_zoom(p, a.tile_store, a.max_zoom)
    try:
        zooms = ZoomRange(a.min_zoom, a.max_zoom)
        buckets = BucketLimits(background=a.max_background_threads, bulk=a.max_bulk_threads)
        return QueuemasterSettings(
            tile_root=a.tile_root, tile_store=a.tile_store, state_file=a.state_file, zooms=zooms,
            render_log=a.render_log,
            render_missing_expired=a.render_missing_expired, propagate_to_zoom=a.propagate_to_zoom, seed=a.seed,
            ping_interval=a.ping_interval, ping_misses=a.ping_misses, metrics_port=a.metrics_port,
            metrics_host=a.metrics_host, buckets=buckets,
            access=AccessPolicy.from_env({"TOPOSM_RENDERER_USERS": a.renderer_users,
                                          "TOPOSM_EXPIRE_USERS": a.expire_users, "TOPOSM_BULK_USERS": a.bulk_users}),
            max_waits=a.max_waits, max_waits_per_account=a.max_waits_per_account,
            default_deadline=a.default_deadline, drain_timeout=a.drain_timeout,
        )
    except ValueError as exc:
        p.error(str(exc))


def main(argv: list[str] | None = None) -> None:
    settings = parse_args(argv)
    # The state machine outlives the unit: handlers still draining after stop() write to its store.
    services: list[QueuemasterService] = []
    with closing(Queuemaster(settings)) as qm:
        def make_service(unit: Unit) -> QueuemasterService:
            services.append(QueuemasterService(unit, qm))
            return services[-1]

        try:
            serve(APP, make_service, drain_timeout=settings.drain_timeout)
        finally:
            for service in services:  # the rows of the requests answered last are deleted too
                service.waiter_store.close()


if __name__ == "__main__":
    main()
