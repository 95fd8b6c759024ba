"""``toposm-renderer``: run N TopOSM render threads (broker from QBROKER_URL)."""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from qbroker.log import configure_logging

from .backends import BACKEND_NAMES
from .renderer import RendererProcess, RendererSettings, short_hostname
from .strategy import StrategyError, parse_strategy


def parse_args(argv: list[str] | None = None) -> RendererSettings:
    p = argparse.ArgumentParser(prog="toposm-renderer", description=__doc__)
    p.add_argument("--threads", type=int, default=1, help="render threads (one worker process each)")
    p.add_argument("--strategy", default="by_work_available",
                   help="missing | important | by_work_available | by_zoom, or a mix: missing:2,by_zoom:6")
    p.add_argument("--backend", choices=BACKEND_NAMES, default="testpattern")
    p.add_argument("--tile-root", type=Path, default=Path("tiles"))
    p.add_argument("--hostname", default=short_hostname(), help="host word in toposm.render.<host>.<pid>.<i>")
    p.add_argument("--render-delay", type=float, default=0.0,
                   help="extra seconds per render (demos and tests that need a render in progress)")
    a = p.parse_args(argv)
    if a.threads < 1:
        p.error("--threads must be at least 1")
    try:
        parse_strategy(a.strategy)
    except StrategyError as exc:
        p.error(str(exc))
    if "." in a.hostname or "*" in a.hostname or "#" in a.hostname:
        p.error("--hostname must be one routing-key word (no '.', '*', '#')")
    return RendererSettings(tile_root=a.tile_root, threads=a.threads, strategy=a.strategy, backend=a.backend,
                            hostname=a.hostname, render_delay=a.render_delay)


async def serve(settings: RendererSettings) -> None:
    renderer = RendererProcess(settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, renderer.stopping.set)
    await renderer.run()


def main(argv: list[str] | None = None) -> None:
    configure_logging()  # to stderr, level from QBROKER_LOG_LEVEL
    asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    main()
