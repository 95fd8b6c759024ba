"""A renderer's Prometheus metrics (``toposm-renderer --metrics-port``): render seconds by zoom, failures,
busy threads. Labels are bounded: a zoom is the tile scheme's 0-30 (anything else is ``other``), a failure
is ``worker_died`` or ``error``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.toposm.metrics_port import ZOOM_LABELS

NAMESPACE = "toposm_renderer"  # its metrics' prefix (toposm_renderer_build_info)
RENDER_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def zoom_label(metatile: str) -> str:
    zoom = metatile.split("/", 1)[0]
    return zoom if zoom in ZOOM_LABELS else "other"


class RendererMetrics:
    def __init__(self, registry: CollectorRegistry, threads: int) -> None:
        self.seconds = Histogram(
            "toposm_renderer_render_seconds",
            "Seconds per metatile render, by zoom",
            ["zoom"],
            buckets=RENDER_BUCKETS,
            registry=registry,
        )
        self.failures = Counter(
            "toposm_renderer_render_failures",
            "Failed renders by kind (worker_died, error)",
            ["kind"],
            registry=registry,
        )
        self.busy = Gauge("toposm_renderer_busy_threads", "Render threads rendering now", registry=registry)
        Gauge("toposm_renderer_threads", "Render threads of this process", registry=registry).set(threads)

    def rendered(self, metatile: str, report: dict[str, object]) -> None:
        if report.get("status") == "ok":
            duration = report.get("duration")
            if isinstance(duration, int | float):
                self.seconds.labels(zoom_label(metatile)).observe(duration)
        else:
            kind = "worker_died" if report.get("reason") == "render worker process died" else "error"
            self.failures.labels(kind).inc()
