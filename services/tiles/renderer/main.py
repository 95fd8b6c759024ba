"""``toposm-renderer``: run N TopOSM render threads."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import model_validator

from qbroker import Unit
from qbroker.runner import serve
from qbroker.settings import option
from services.osmstore.style_layers import check_source
from services.toposm.settings import StackSettings, UserList, stack_option
from services.toposm.strategy import parse_strategy
from services.toposm.tile_store import TileStoreKind

from .backends import BACKEND_NAMES
from .process import APP, RendererProcess
from .settings import RendererSettings, short_hostname

Backend = Literal[BACKEND_NAMES]  # type: ignore[valid-type]


class RendererOptions(StackSettings):
    prog = "toposm-renderer"
    description = __doc__

    threads: int = option(1, "render threads (one worker process each)", ge=1)
    strategy: str = option(
        "by_work_available", "missing | important | by_work_available | by_zoom, or a mix: missing:2,by_zoom:6"
    )
    backend: Backend | None = option(None, "the renderer", default_text="mapnik with --store, else testpattern")
    store: str | None = option(
        None,
        "render real OSM data: a toposm-import store directory or a PostGIS DSN (mapnik backend)",
        metavar="DIR|DSN",
    )
    tile_root: Path = stack_option("tile_root")
    tile_store: TileStoreKind = stack_option("tile_store")
    hostname: str = option(short_hostname(), "host word in toposm.render.<host>.<pid>.<i>", default_text="this host")
    render_delay: float = option(0.0, "extra seconds per render (demos and tests that need a render in progress)", ge=0)
    operator_users: UserList = stack_option(
        "operator_users",
        help="broker accounts that may send the `shutdown` "
        "alert (comma-separated); empty: nobody (stop renderers with SIGTERM)",
    )
    queuemaster_users: UserList = option(
        frozenset(), "accounts that may send `render`; empty: no check", metavar="USERS"
    )

    @model_validator(mode="after")
    def _consistent(self) -> RendererOptions:
        if self.store:
            problem = check_source(self.store)
            if problem:
                raise ValueError(problem)
            if self.backend not in (None, "mapnik"):
                raise ValueError("--store needs the mapnik backend")
        parse_strategy(self.strategy)  # StrategyError is a ValueError naming the problem
        if "." in self.hostname or "*" in self.hostname or "#" in self.hostname:
            raise ValueError("--hostname must be one routing-key word (no '.', '*', '#')")
        return self

    def renderer_settings(self) -> RendererSettings:
        if self.store:
            os.environ["TOPOSM_STORE"] = self.store  # the render worker processes inherit it
        return RendererSettings(
            tile_root=self.tile_root,
            tile_store=self.tile_store,
            threads=self.threads,
            strategy=self.strategy,
            backend=self.backend or ("mapnik" if self.store else "testpattern"),
            hostname=self.hostname,
            render_delay=self.render_delay,
            drain_timeout=self.drain_timeout,
            operator_users=self.operator_users,
            queuemaster_users=self.queuemaster_users or None,
            metrics_port=self.metrics_port,
            metrics_host=self.metrics_host,
        )


def parse_args(argv: list[str] | None = None) -> RendererSettings:
    return RendererOptions.parse(argv).renderer_settings()


def main(argv: list[str] | None = None) -> None:
    options = RendererOptions.parse(argv)
    settings = options.renderer_settings()

    def make_service(unit: Unit) -> RendererProcess:
        return RendererProcess(unit, settings)

    # The unit's drain follows the renders' own: reports of finished renders are the last calls out.
    serve(APP, make_service, settings=options)


if __name__ == "__main__":
    main()
