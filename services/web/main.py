"""``toposm-web``: the operator's view (status page, slippy map, tiles on demand, metrics) on the bus."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import model_validator

from qbroker.log import json_lines
from qbroker.runner import serve
from qbroker.settings import option, shared
from services.toposm.settings import StackSettings, check_zooms, stack_option
from services.toposm.tile_store import TileStoreKind, check_tile_store_zoom
from services.toposm.tilemath import ZoomRange

from .access_log import ACCESS_LOG_ENV, STDOUT
from .cache_policy import CacheOptions
from .front import FRONTS
from .service import APP, DRAIN_TIMEOUT, WebService, WebSettings
from .tiles import OnDemandLimits

Front = Literal[FRONTS]  # type: ignore[valid-type]


class WebOptions(StackSettings, CacheOptions):
    prog = "toposm-web"
    description = __doc__

    tile_root: Path = stack_option("tile_root")
    tile_store: TileStoreKind = stack_option("tile_store")
    host: str = option("127.0.0.1", "address to listen on", metavar="HOST")
    port: int = option(8080, "HTTP port (0: any free port)", metavar="PORT", ge=0, le=65535)
    render_log: Path | None = stack_option(
        "render_log", help="the queuemaster's render log (recent renders, failures, durations)"
    )
    min_zoom: int = stack_option("min_zoom")
    max_zoom: int = stack_option("max_zoom")
    poll_interval: float = option(1.0, "seconds between queuemaster stats polls", gt=0)
    render_timeout: float = option(30.0, "seconds a tile request waits for a render", gt=0)
    max_renders_per_client: int = option(8, "on-demand metatile renders in flight for one client address", ge=1)
    max_renders: int = option(64, "on-demand metatile renders in flight in total", ge=1)
    front: Front | None = option(
        None,
        "nginx: Debian's nginx answers on --port and serves tile hits from "
        "--tile-root itself, the rest comes to toposm-web behind it (docs/web.md)",
        default_text="none: toposm-web answers on --port",
    )
    front_workers: int = option(0, "nginx worker processes (0: one per core)", ge=0)
    access_log: str | None = option(
        None,
        "write an access log in the Combined Log Format to PATH, or - for "
        "standard output; with --front nginx, nginx writes it",
        metavar="PATH|-",
        env=ACCESS_LOG_ENV,
        default_text="none",
    )
    rerenders_per_minute: int = option(
        30, "re-render requests (POST /api/render) a client address may send in a minute", ge=1
    )
    rerender_interval: float = option(
        60.0, "seconds after a re-render during which another re-render of that metatile is a no-op", ge=0
    )
    drain_timeout: float = shared(StackSettings, "drain_timeout", DRAIN_TIMEOUT)

    @model_validator(mode="after")
    def _consistent(self) -> WebOptions:
        check_tile_store_zoom(self.tile_store, self.max_zoom)
        check_zooms(self.min_zoom, self.max_zoom)
        if self.front == "nginx" and self.tile_store != "png":
            raise ValueError(
                "--front nginx serves <root>/z/x/y.png files; a --tile-store meta root is served by "
                "toposm-web alone, or by Apache's mod_tile"
            )
        if self.access_log not in (None, STDOUT):
            try:
                with open(self.access_log, "a"):
                    pass
            except OSError as exc:
                raise ValueError(f"--access-log {self.access_log}: {exc.strerror}") from None
        if self.drain_timeout <= 0:
            raise ValueError("--drain-timeout must be positive")
        return self

    def web_settings(self) -> WebSettings:
        return WebSettings(
            tile_root=self.tile_root,
            tile_store=self.tile_store,
            host=self.host,
            port=self.port,
            render_log=self.render_log,
            zooms=ZoomRange(self.min_zoom, self.max_zoom),
            poll_interval=self.poll_interval,
            cache=self.cache_policy(),
            drain_timeout=self.drain_timeout,
            front=self.front,
            front_workers=self.front_workers,
            access_log=self.access_log or None,
            limits=OnDemandLimits(
                per_client=self.max_renders_per_client,
                total=self.max_renders,
                timeout=self.render_timeout,
                rerender_interval=self.rerender_interval,
                rerenders_per_minute=self.rerenders_per_minute,
            ),
        )


def parse_args(argv: list[str] | None = None) -> WebSettings:
    return WebOptions.parse(argv).web_settings()


class _AnnouncedWebService(WebService):
    """Prints the page URLs once the HTTP server is bound (the port is known only then with --port 0)."""

    async def start(self) -> None:
        await super().start()
        if json_lines():  # JSON logs: the `toposm-web serving` line says it, and stdout holds JSON alone
            return
        print(f"toposm-web: status {self.url}/  map {self.url}/map  metrics {self.url}/metrics", flush=True)


def main(argv: list[str] | None = None) -> None:
    options = WebOptions.parse(argv)
    settings = options.web_settings()
    # The service's own stop takes at most half the drain timeout, the unit's drain the other half.
    serve(
        APP,
        lambda unit: _AnnouncedWebService(unit, settings),
        settings=options,
        drain_timeout=settings.drain_timeout / 2,
    )


if __name__ == "__main__":
    main()
