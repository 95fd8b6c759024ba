"""``/metrics``: toposm-web's own figures (the RPC calls it made, the tiles it served, its renders on demand
and live streams, whether its last queuemaster poll answered), its build info and the library's metrics of
its unit (qbroker.metrics). What the other services own (queues, renders, threads, jobs, dead letters) each
of them exports itself on its ``--metrics-port``; toposm-web does not repeat them (docs/metrics.md, and
docs/decisions.md for why)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from qbroker.metrics import program_registry
from services.toposm import __version__
from services.toposm.metrics_port import service_unit_metrics

from .status import StatusModel

NAMESPACE = "toposm_web"  # its metrics' prefix (toposm_web_build_info)


class QueuemasterPoll(Collector):
    """Whether toposm-web's last ``stats`` poll of the queuemaster answered: its own view of the bus (what
    its status page shows), read at scrape time."""

    def __init__(self, status: StatusModel) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        s = self.status
        up = GaugeMetricFamily(
            "toposm_web_queuemaster_up", "1 when toposm-web's last stats poll of the queuemaster answered"
        )
        up.add_metric([], 1 if s.queuemaster_error is None and s.queuemaster is not None else 0)
        yield up


class WebMetrics:
    def __init__(self, status: StatusModel) -> None:
        self.registry = program_registry(NAMESPACE, __version__)
        self.registry.register(QueuemasterPoll(status))
        self.library = service_unit_metrics(self.registry)
        self.rpc_calls = Counter(
            "toposm_web_rpc_calls",
            "RPC calls made by toposm-web, by endpoint and status",
            ["endpoint", "status"],
            registry=self.registry,
        )
        self.tile_requests = Counter(
            "toposm_web_tile_requests", "Tile requests by outcome", ["outcome"], registry=self.registry
        )
        self.on_demand = Gauge(
            "toposm_web_on_demand_renders", "On-demand renders being waited for", registry=self.registry
        )
        self.sse_clients = Gauge("toposm_web_live_clients", "Open live-update streams", registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
