"""Opt-in Prometheus metrics for a unit: handled requests and alerts per endpoint and status, durations.

``instrument(unit)`` hooks into the unit's ``handler_observers`` (one callback per finished handler:
RPC requests and alert listeners). Nothing is counted unless a program asks for it, and the core does
not import prometheus-client (``pip install qbroker[metrics]``). A unit with an HTTP server of its own
renders ``generate_latest(registry)``; any other can call ``start_http_server(port, registry)``.

Alert names come from the wire (a forged or per-job name such as ``spark.progress.<id>``), so labels are
capped: past ``max_names`` distinct names, further ones are counted under ``other``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

if TYPE_CHECKING:
    from qbroker.unit import Unit

OTHER = "other"
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class UnitMetrics:
    """The library's own metrics for one or more units, on one registry."""

    def __init__(self, registry: CollectorRegistry | None = None, *, max_names: int = 200) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.max_names = max_names
        self._names: set[str] = set()
        self.handled = Counter(
            "qbroker_handled", "Requests and alerts handled, by endpoint (or alert name), kind and status",
            ["endpoint", "kind", "status"], registry=self.registry)
        self.errors = Counter(
            "qbroker_handler_errors", "Handled messages whose status was error or fail",
            ["endpoint", "kind", "status"], registry=self.registry)
        self.duration = Histogram(
            "qbroker_handler_duration_seconds", "Time spent in handlers, by endpoint and kind",
            ["endpoint", "kind"], buckets=DURATION_BUCKETS, registry=self.registry)

    def _label(self, endpoint: str) -> str:
        if endpoint in self._names:
            return endpoint
        if len(self._names) >= self.max_names:
            return OTHER
        self._names.add(endpoint)
        return endpoint

    def observe(self, endpoint: str, kind: str, status: str, seconds: float) -> None:
        name = self._label(endpoint)
        self.handled.labels(name, kind, status).inc()
        if status in ("error", "fail"):
            self.errors.labels(name, kind, status).inc()
        self.duration.labels(name, kind).observe(seconds)


def instrument(unit: Unit, metrics: UnitMetrics | None = None) -> UnitMetrics:
    """Count every handler this unit runs on ``metrics`` (a new registry when not given)."""
    metrics = metrics or UnitMetrics()
    unit.handler_observers.append(metrics.observe)
    return metrics


def serve(metrics: UnitMetrics, port: int, addr: str = "127.0.0.1") -> None:
    """Expose ``metrics`` on ``http://addr:port/metrics`` from a background thread (units without HTTP)."""
    start_http_server(port, addr=addr, registry=metrics.registry)
