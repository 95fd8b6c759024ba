"""The TopOSM services' ``--metrics-port`` (the library's qbroker.metrics_port, docs/metrics.md).

What the services add to it: their error ids as labels of their own (services/toposm/error_messages.py), render
threads' and jobs' names labelled without their process id or job id (``contract.metric_label``), the
stack's version (``services.toposm.__version__``), and the zoom labels their own metrics use.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from qbroker.metrics import UnitMetrics
from qbroker.metrics_port import MetricsServer
from services.toposm import __version__
from services.toposm.contract import metric_label
from services.toposm.error_messages import MESSAGES

# Zoom labels are bounded by the tile scheme (0-30); anything else a message could name is not a label.
ZOOM_LABELS = tuple(str(z) for z in range(31))


def service_unit_metrics(registry: CollectorRegistry) -> UnitMetrics:
    """The library's metrics of a service's unit on ``registry``."""
    return UnitMetrics(registry, error_ids=MESSAGES, endpoint_label=metric_label)


def service_metrics(namespace: str, port: int | None, host: str = "127.0.0.1") -> MetricsServer:
    """A service's metrics server; ``namespace`` its metric prefix (``toposm_queuemaster``...)."""
    return MetricsServer(namespace, port, host, version=__version__, unit_metrics=service_unit_metrics)
