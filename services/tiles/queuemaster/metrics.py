"""The queuemaster's Prometheus metrics (``toposm-queuemaster --metrics-port``).

Queue depth by kind and zoom, metatiles rendering by kind, waiting render requests, render threads by state and the
finished renders come from the state machine, copied on the event loop once a second (``refresh``); the
dispatch latency (a render thread accepting a ``render``) is observed where it is measured. Labels are
bounded: kinds and states are fixed words, zooms the tile scheme's 0-30 (``all`` for the kinds that are not
queued by zoom).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .state_machine import Queuemaster

NAMESPACE = "toposm_queuemaster"  # its metrics' prefix (toposm_queuemaster_build_info)
DISPATCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
THREAD_STATES = ("idle", "rendering", "dispatching")
# The queue classes as the metrics name them: a background metatile is an expired one.
KINDS = {"missing": "missing", "important": "important", "background": "expired", "bulk": "bulk"}
RENDER_OUTCOMES = ("rendered", "failed")
# What the osm wire did not take as sent: a command refused for its reply_to (a queue of the bus's own),
# parameters ignored (unknown to us). The stats counters of the same names.
OSM_WIRE_EVENTS = {"reply_to_refused": "osm_reply_to_refused", "unknown_fields_ignored": "osm_unknown_fields"}


class QueuemasterMetrics:
    def __init__(self, qm: Queuemaster, registry: CollectorRegistry) -> None:
        self.qm = qm
        self.depth = Gauge(
            "toposm_queuemaster_queue_depth",
            "Metatiles queued: missing, important and bulk (zoom all), expired by zoom",
            ["kind", "zoom"],
            registry=registry,
        )
        self.rendering = Gauge(
            "toposm_queuemaster_rendering",
            "Metatiles being rendered, by the kind they were queued as",
            ["kind"],
            registry=registry,
        )
        self.waiters = Gauge(
            "toposm_queuemaster_waiters", "Render requests waiting for their metatile", registry=registry
        )
        self.threads = Gauge(
            "toposm_queuemaster_render_threads", "Registered render threads by state", ["state"], registry=registry
        )
        self.renders = Counter(
            "toposm_queuemaster_renders", "Finished renders (rate: renders per second)", ["status"], registry=registry
        )
        self.expired = Counter("toposm_queuemaster_expired_tiles", "Tiles named in expiry lists", registry=registry)
        self.dispatch = Histogram(
            "toposm_queuemaster_dispatch_seconds",
            "From sending `render` to a render thread until it accepted the metatile",
            buckets=DISPATCH_BUCKETS,
            registry=registry,
        )
        self.osm_wire = Counter(
            "toposm_queuemaster_osm_wire",
            "On the osm wire: commands refused for their "
            "reply_to (a queue of the bus's own), unknown parameters ignored",
            ["event"],
            registry=registry,
        )
        for event in OSM_WIRE_EVENTS:
            self.osm_wire.labels(event)
        self._zooms: set[str] = set()
        self._counted: dict[str, int] = {}

    def refresh(self) -> None:
        queue = self.qm.queue
        self.depth.labels("missing", "all").set(queue.missing)
        self.depth.labels("important", "all").set(queue.important)
        self.depth.labels("bulk", "all").set(queue.bulk)
        by_zoom = {str(z): n for z, n in queue.background_by_zoom().items()}
        for zoom in self._zooms | set(by_zoom):  # a zoom whose queue emptied reads 0, not its last value
            self.depth.labels("expired", zoom).set(by_zoom.get(zoom, 0))
        self._zooms |= set(by_zoom)
        flying = queue.in_flight_by_class()
        for cls, kind in KINDS.items():
            self.rendering.labels(kind).set(flying[cls])
        self.waiters.set(self.qm.waiting)
        states = dict.fromkeys(THREAD_STATES, 0)
        for thread in self.qm.threads:
            states[thread.state] = states.get(thread.state, 0) + 1
        for state in THREAD_STATES:
            self.threads.labels(state).set(states[state])
        counters = self.qm.stats.counters
        for name in RENDER_OUTCOMES:
            self._advance(self.renders.labels(name), name, counters[name])
        self._advance(self.expired, "expired", counters["expired"])
        for event, name in OSM_WIRE_EVENTS.items():
            self._advance(self.osm_wire.labels(event), name, counters[name])

    def _advance(self, counter: Counter, key: str, total: int) -> None:
        # The state machine keeps totals; a Prometheus counter only goes up by the difference.
        delta = total - self._counted.get(key, 0)
        if delta > 0:
            counter.inc(delta)
            self._counted[key] = total
