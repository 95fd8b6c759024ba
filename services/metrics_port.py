"""``--metrics-port``: a service's Prometheus metrics on an HTTP port of its own (prometheus-client).

Opt-in, like the library's metrics: without the option nothing listens. The registry holds the service's
own metrics and the library's (``qbroker.metrics.instrument``: handled and sent, errors by id, durations,
in flight, reconnects, dead letters answered). prometheus-client serves it from a thread, so a service
never lets that thread read its state: it copies numbers into the registry from its own event loop
(``refresh`` callbacks every ``REFRESH`` seconds) or updates them where they change.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog
from prometheus_client import CollectorRegistry, start_http_server

from qbroker import Unit
from qbroker.metrics import UnitMetrics, instrument
from services.error_messages import MESSAGES

log = structlog.get_logger("toposm.metrics")
REFRESH = 1.0  # seconds between copies of a service's state into its gauges
# Zoom labels are bounded by the tile scheme (0-30); anything else a message could name is not a label.
ZOOM_LABELS = tuple(str(z) for z in range(31))


def add_metrics_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics on this port (0: any free port); default: no metrics server")
    p.add_argument("--metrics-host", default="127.0.0.1", help="address of the metrics server")


def check_metrics_options(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    if a.metrics_port is not None and not 0 <= a.metrics_port <= 65535:
        p.error("--metrics-port must be 0..65535")


@dataclass
class MetricsServer:
    """One registry, served on ``port`` once ``start`` runs; ``refresh`` callbacks run on the loop."""

    port: int | None
    host: str = "127.0.0.1"
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    refreshers: list[Callable[[], None]] = field(default_factory=list)
    bound_port: int | None = None
    _task: asyncio.Task[None] | None = None
    _server: object = None

    @property
    def enabled(self) -> bool:
        return self.port is not None

    def instrument(self, unit: Unit) -> None:
        """The library's metrics of this unit (qbroker.metrics) on the same registry; the services' error ids
        (services/error_messages.py) are labels of their own."""
        if self.enabled:
            instrument(unit, UnitMetrics(self.registry, error_ids=MESSAGES))

    def start(self) -> None:
        if not self.enabled:
            return
        assert self.port is not None
        self._refresh()
        server, _ = start_http_server(self.port, addr=self.host, registry=self.registry)
        self._server = server
        self.bound_port = int(server.server_address[1])
        self._task = asyncio.get_running_loop().create_task(self._loop())
        log.info("metrics serving", url=f"http://{self.host}:{self.bound_port}/metrics")

    def _refresh(self) -> None:
        for refresh in self.refreshers:
            try:
                refresh()
            except Exception:  # a metric must never take the service down
                log.exception("metrics refresh failed")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(REFRESH)
            self._refresh()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        shutdown = getattr(self._server, "shutdown", None)
        if shutdown is not None:
            await asyncio.to_thread(shutdown)
            self._server.server_close()  # type: ignore[attr-defined]
