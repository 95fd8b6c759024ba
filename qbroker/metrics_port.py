"""``--metrics-port``: a program's Prometheus metrics on an HTTP port of its own (prometheus-client).

Opt-in: without the option nothing listens, and nothing here imports prometheus-client (the ``metrics``
extra) until a ``MetricsServer`` is made. The registry holds the program's build info
(``qbroker.metrics.program_registry``), the library's metrics of its unit (``instrument``) and whatever the
program adds. prometheus-client serves it from a thread, so a program never lets that thread read its
state: it copies numbers into the registry from its own event loop (``refreshers``, every ``REFRESH``
seconds) or updates them where they change. The names and labels: docs/metrics.md.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from qbroker import __version__

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from qbroker.metrics import UnitMetrics
    from qbroker.unit import Unit

log = structlog.get_logger("qbroker.metrics")
REFRESH = 1.0  # seconds between copies of a program's state into its gauges


def _library_metrics(registry: CollectorRegistry) -> UnitMetrics:
    from qbroker.metrics import UnitMetrics

    return UnitMetrics(registry)


@dataclass
class MetricsServer:
    """One program's registry, served on ``port`` once ``start`` runs (None: not served; the registry is
    there all the same); ``refreshers`` run on the loop. ``namespace`` is the program's metric prefix
    (``<namespace>_build_info``), ``version`` the program's own (the library's by default);
    ``unit_metrics`` makes the library's metrics of its unit on the registry (error ids and endpoint labels
    of an application's own: ``UnitMetrics``' options)."""

    namespace: str
    port: int | None
    host: str = "127.0.0.1"
    version: str = __version__
    unit_metrics: Callable[[CollectorRegistry], UnitMetrics] = _library_metrics
    refreshers: list[Callable[[], None]] = field(default_factory=list)
    registry: CollectorRegistry = field(init=False)
    bound_port: int | None = field(default=None, init=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False)
    _server: object = field(default=None, init=False)

    def __post_init__(self) -> None:
        from qbroker.metrics import program_registry

        self.registry = program_registry(self.namespace, self.version)

    @property
    def enabled(self) -> bool:
        return self.port is not None

    def instrument(self, unit: Unit) -> None:
        """The library's metrics of this unit (qbroker.metrics) on the same registry, when served."""
        from qbroker.metrics import instrument

        if self.enabled:
            instrument(unit, self.unit_metrics(self.registry))

    def start(self) -> None:
        if not self.enabled:
            return
        assert self.port is not None
        from prometheus_client import start_http_server

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
            except Exception:  # a metric must never take the program down
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
