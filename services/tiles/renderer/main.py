"""``toposm-renderer``: run N TopOSM render threads (broker from QBROKER_URL)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from qbroker import Unit
from qbroker.metrics_port import add_metrics_options, check_metrics_options
from qbroker.runner import serve
from services.osmstore.style_layers import check_source
from services.toposm.strategy import StrategyError, parse_strategy
from services.toposm.tile_store import add_tile_store_option

from .backends import BACKEND_NAMES
from .process import APP, RendererProcess
from .settings import RendererSettings, short_hostname


def parse_args(argv: list[str] | None = None) -> RendererSettings:
    p = argparse.ArgumentParser(prog="toposm-renderer", description=__doc__)
    p.add_argument("--threads", type=int, default=1, help="render threads (one worker process each)")
    p.add_argument("--strategy", default="by_work_available",
                   help="missing | important | by_work_available | by_zoom, or a mix: missing:2,by_zoom:6")
    p.add_argument("--backend", choices=BACKEND_NAMES, default=None,
                   help="default: mapnik with --store, else testpattern")
    p.add_argument("--store", default=None, metavar="DIR|DSN",
                   help="render real OSM data: a toposm-import store directory or a PostGIS DSN (mapnik backend)")
    p.add_argument("--tile-root", type=Path, default=Path("tiles"))
    add_tile_store_option(p)
    p.add_argument("--hostname", default=short_hostname(), help="host word in toposm.render.<host>.<pid>.<i>")
    p.add_argument("--render-delay", type=float, default=0.0,
                   help="extra seconds per render (demos and tests that need a render in progress)")
    p.add_argument("--drain-timeout", type=float, default=10.0,
                   help="on SIGTERM, seconds to finish the metatiles in hand before handing them back")
    p.add_argument("--operator-users", default=os.environ.get("TOPOSM_OPERATOR_USERS", ""),
                   help="broker accounts that may send the `shutdown` alert (comma-separated; env "
                   "TOPOSM_OPERATOR_USERS). Empty: nobody (stop renderers with SIGTERM)")
    p.add_argument("--queuemaster-users", default=os.environ.get("TOPOSM_QUEUEMASTER_USERS", ""),
                   help="accounts that may send `render` (env TOPOSM_QUEUEMASTER_USERS); empty: no check")
    add_metrics_options(p)
    a = p.parse_args(argv)
    check_metrics_options(p, a)
    if a.drain_timeout < 0:
        p.error("--drain-timeout must not be negative")
    if a.store:
        problem = check_source(a.store)
        if problem:
            p.error(problem)
        if a.backend not in (None, "mapnik"):
            p.error("--store needs the mapnik backend")
        os.environ["TOPOSM_STORE"] = a.store  # the render worker processes inherit it
    backend = a.backend or ("mapnik" if a.store else "testpattern")
    if a.threads < 1:
        p.error("--threads must be at least 1")
    try:
        parse_strategy(a.strategy)
    except StrategyError as exc:
        p.error(str(exc))
    if "." in a.hostname or "*" in a.hostname or "#" in a.hostname:
        p.error("--hostname must be one routing-key word (no '.', '*', '#')")
    return RendererSettings(tile_root=a.tile_root, tile_store=a.tile_store, threads=a.threads, strategy=a.strategy,
                            backend=backend,
                            hostname=a.hostname, render_delay=a.render_delay,
                            drain_timeout=a.drain_timeout, operator_users=_users(a.operator_users) or frozenset(),
                            queuemaster_users=_users(a.queuemaster_users), metrics_port=a.metrics_port,
                            metrics_host=a.metrics_host)


def _users(raw: str) -> frozenset[str] | None:
    users = frozenset(u.strip() for u in raw.split(",") if u.strip())
    return users or None



def main(argv: list[str] | None = None) -> None:
    settings = parse_args(argv)

    def make_service(unit: Unit) -> RendererProcess:
        return RendererProcess(unit, settings)

    # The unit's drain follows the renders' own: reports of finished renders are the last calls out.
    serve(APP, make_service, drain_timeout=settings.drain_timeout)


if __name__ == "__main__":
    main()
