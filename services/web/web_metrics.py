"""``/metrics``: the bus as Prometheus sees it (mirrored from the status model at scrape time) plus this
service's own counters (RPC calls it made, tiles it served) and the library's metrics (qbroker.metrics)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from qbroker.metrics import UnitMetrics
from services.error_messages import MESSAGES

from .bounds import OTHER, top_n
from .status import MAX_ZOOMS, StatusModel

RENDER_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
JOB_STATES = ("queued", "running", "succeeded", "failed", "cancelled")


class BusCollector(Collector):
    """Values owned by other processes (queue lengths, render counts, jobs), read from the latest poll."""

    def __init__(self, status: StatusModel) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        s = self.status
        queues = s.queues()
        length = GaugeMetricFamily("toposm_queue_length", "Metatiles queued, by kind and zoom",
                                   labels=["kind", "zoom"])
        length.add_metric(["missing", "all"], queues["missing"])
        length.add_metric(["important", "all"], queues["important"])
        length.add_metric(["bulk", "all"], queues["bulk"])
        for zoom, n in queues["expired_by_zoom"].items():  # bounded in StatusModel.queues
            length.add_metric(["expired", zoom], n)
        yield length
        yield GaugeMetricFamily("toposm_metatiles_rendering", "Metatiles being rendered now",
                                value=queues["rendering"])
        up = GaugeMetricFamily("toposm_queuemaster_up", "1 when the last stats poll answered")
        up.add_metric([], 1 if s.queuemaster_error is None and s.queuemaster is not None else 0)
        yield up
        renders = CounterMetricFamily("toposm_renders", "Metatiles rendered, by render thread",
                                      labels=["renderer"])
        for name, n in top_n(s.renders_by_renderer).items():
            renders.add_metric([name], n)
        yield renders
        failures = CounterMetricFamily("toposm_render_failures", "Failed renders, by render thread",
                                       labels=["renderer"])
        for name, n in top_n(s.failures_by_renderer).items():
            failures.add_metric([name], n)
        yield failures
        threads = GaugeMetricFamily("toposm_render_threads", "Registered render threads, by state",
                                    labels=["state"])
        by_state: dict[str, int] = {}
        for thread in s.renderers():
            by_state[str(thread.get("state"))] = by_state.get(str(thread.get("state")), 0) + 1
        for state, n in top_n(by_state).items():
            threads.add_metric([state], n)
        yield threads
        dead = GaugeMetricFamily("qbroker_dead_letters", "Dead messages counted by the bus's collectors",
                                 labels=["kind", "reason"])
        for key, n in s.dead_letters.items():  # top_n already (StatusModel.set_units)
            kind, _, reason = key.partition(".")
            dead.add_metric([kind, reason or (OTHER if kind == OTHER else "unknown")], n)
        yield dead
        jobs = GaugeMetricFamily("spark_jobs", "Spark bridge jobs known to this service, by state",
                                 labels=["state"])
        counts = dict.fromkeys(JOB_STATES, 0)
        for job in s.jobs.values():
            state = str(job.get("state"))
            counts[state] = counts.get(state, 0) + 1
        for state, n in top_n(counts, len(JOB_STATES) + 5).items():
            jobs.add_metric([state], n)
        yield jobs


class WebMetrics:
    def __init__(self, status: StatusModel) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(BusCollector(status))
        self.library = UnitMetrics(self.registry, error_ids=MESSAGES)
        self.rpc_calls = Counter("toposm_web_rpc_calls", "RPC calls made by toposm-web, by endpoint and status",
                                 ["endpoint", "status"], registry=self.registry)
        self.render_duration = Histogram("toposm_render_duration_seconds",
                                         "Metatile render durations (from the render log), by zoom",
                                         ["zoom"], buckets=RENDER_BUCKETS, registry=self.registry)
        self.tile_requests = Counter("toposm_web_tile_requests", "Tile requests by outcome", ["outcome"],
                                     registry=self.registry)
        self.on_demand = Gauge("toposm_web_on_demand_renders", "On-demand renders being waited for",
                               registry=self.registry)
        self.sse_clients = Gauge("toposm_web_live_clients", "Open live-update streams", registry=self.registry)

    def observe_render(self, record: dict[str, Any]) -> None:
        duration = record.get("duration")
        if record.get("status") == "ok" and isinstance(duration, int | float) and duration >= 0:
            zoom = record.get("zoom")
            label = str(zoom) if isinstance(zoom, int) and 0 <= zoom < MAX_ZOOMS else OTHER  # a series per zoom only
            self.render_duration.labels(label).observe(duration)

    def render(self) -> bytes:
        return generate_latest(self.registry)
