"""``toposm-web``: the operator's view (status page, slippy map, tiles on demand, metrics) on the bus."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from qbroker.log import json_lines
from qbroker.runner import serve
from services.toposm.tile_store import add_tile_store_option, check_tile_store_zoom
from services.toposm.tilemath import ZoomRange

from .access_log import ACCESS_LOG_ENV, STDOUT
from .cache_policy import add_cache_options, cache_policy_from
from .front import FRONTS
from .service import APP, DRAIN_TIMEOUT, WebService, WebSettings
from .tiles import OnDemandLimits


def parse_args(argv: list[str] | None = None) -> WebSettings:
    p = argparse.ArgumentParser(prog="toposm-web", description=__doc__)
    p.add_argument("--tile-root", type=Path, default=Path("tiles"), help="tile store root (<root>/z/x/y.png)")
    add_tile_store_option(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8080, help="HTTP port (0: any free port)")
    p.add_argument("--render-log", type=Path, default=None,
                   help="the queuemaster's render log (recent renders, failures, durations)")
    p.add_argument("--min-zoom", type=int, default=0)
    p.add_argument("--max-zoom", type=int, default=18)
    p.add_argument("--poll-interval", type=float, default=1.0, help="seconds between queuemaster stats polls")
    p.add_argument("--render-timeout", type=float, default=30.0, help="seconds a tile request waits for a render")
    p.add_argument("--max-renders-per-client", type=int, default=8)
    p.add_argument("--max-renders", type=int, default=64, help="on-demand metatile renders in flight in total")
    p.add_argument("--front", choices=FRONTS, default=None,
                   help="nginx: Debian's nginx answers on --port and serves tile hits from --tile-root itself, "
                        "the rest comes to toposm-web behind it (docs/web.md)")
    p.add_argument("--front-workers", type=int, default=0, help="nginx worker processes (0: one per core)")
    p.add_argument("--access-log", metavar="PATH|-", default=os.environ.get(ACCESS_LOG_ENV) or None,
                   help=f"write an access log in the Combined Log Format to PATH, or - for standard output "
                        f"(default: ${ACCESS_LOG_ENV}, else none); with --front nginx, nginx writes it")
    add_cache_options(p)
    p.add_argument("--rerenders-per-minute", type=int, default=30,
                   help="re-render requests (POST /api/render) a client address may send on a minute")
    p.add_argument("--rerender-interval", type=float, default=60.0,
                   help="seconds after a re-render during which another re-render of that metatile is a no-op")
    p.add_argument("--drain-timeout", type=float, default=DRAIN_TIMEOUT,
                   help="seconds SIGTERM waits for requests in flight before closing them")
    a = p.parse_args(argv)
    check_tile_store_zoom(p, a.tile_store, a.max_zoom)
    try:
        zooms = ZoomRange(a.min_zoom, a.max_zoom)
        cache = cache_policy_from(a)
    except ValueError as exc:
        p.error(str(exc))
    if not 0 <= a.port <= 65535:
        p.error("--port must be 0..65535")
    if a.front == "nginx" and a.tile_store != "png":
        p.error("--front nginx serves <root>/z/x/y.png files; a --tile-store meta root is served by toposm-web "
                "alone, or by Apache's mod_tile")
    if a.access_log not in (None, STDOUT):
        try:
            with open(a.access_log, "a"):
                pass
        except OSError as exc:
            p.error(f"--access-log {a.access_log}: {exc.strerror}")
    if a.front_workers < 0:
        p.error("--front-workers must not be negative")
    if (a.poll_interval <= 0 or a.render_timeout <= 0 or a.drain_timeout <= 0 or a.rerender_interval < 0
            or min(a.max_renders, a.max_renders_per_client, a.rerenders_per_minute) < 1):
        p.error("intervals, timeouts and limits must be positive")
    return WebSettings(tile_root=a.tile_root, tile_store=a.tile_store, host=a.host, port=a.port,
                       render_log=a.render_log, zooms=zooms,
                       poll_interval=a.poll_interval, cache=cache, drain_timeout=a.drain_timeout,
                       front=a.front, front_workers=a.front_workers, access_log=a.access_log,
                       limits=OnDemandLimits(per_client=a.max_renders_per_client, total=a.max_renders,
                                             timeout=a.render_timeout, rerender_interval=a.rerender_interval,
                                             rerenders_per_minute=a.rerenders_per_minute))


class _AnnouncedWebService(WebService):
    """Prints the page URLs once the HTTP server is bound (the port is known only then with --port 0)."""

    async def start(self) -> None:
        await super().start()
        if json_lines():  # JSON logs: the `toposm-web serving` line says it, and stdout holds JSON alone
            return
        print(f"toposm-web: status {self.url}/  map {self.url}/map  metrics {self.url}/metrics", flush=True)


def main(argv: list[str] | None = None) -> None:
    settings = parse_args(argv)
    # The service's own stop takes at most half the drain timeout, the unit's drain the other half.
    serve(APP, lambda unit: _AnnouncedWebService(unit, settings), drain_timeout=settings.drain_timeout / 2)


if __name__ == "__main__":
    main()
