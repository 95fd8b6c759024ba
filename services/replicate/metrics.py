"""``toposm-replicate --metrics-port``: what an operator of a replication follower watches.

The sequence each store is at, batches and diffs applied, seconds per batch, the rounds that failed and
were retried after a back-off (by what failed: the source did not answer, or it answered what cannot be
followed; the bridge or the bus; osm2pgsql/PostgreSQL), the failures in a row now, and the metatiles
published from osm2pgsql's own expiry. Updated where they change, on the follower's loop. Labels are
bounded: stores are ``store`` and ``postgis``, failures the five words of ``FAILURES``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

NAMESPACE = "toposm_replicate"  # its metrics' prefix (toposm_replicate_build_info)
FAILURES = ("source", "answer", "bridge", "bus", "postgis")
BATCH_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


class ReplicateMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.sequence = Gauge(
            "toposm_replicate_sequence", "The last replication sequence applied, by store", ["store"], registry=registry
        )
        self.batches = Counter(
            "toposm_replicate_batches", "Batches (merged diffs) applied, by store", ["store"], registry=registry
        )
        self.diffs = Counter(
            "toposm_replicate_diffs", "Replication diffs applied, by store", ["store"], registry=registry
        )
        self.seconds = Histogram(
            "toposm_replicate_batch_seconds",
            "Seconds to apply one batch to one store",
            ["store"],
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.failures = Counter(
            "toposm_replicate_failures",
            "Rounds that failed and were retried after a back-off",
            ["what"],
            registry=registry,
        )
        self.failing = Gauge(
            "toposm_replicate_failures_in_a_row", "Failed rounds since the last good one", registry=registry
        )
        self.expired = Counter(
            "toposm_replicate_expired_metatiles",
            "Metatiles published as expire_toposm from osm2pgsql's expiry (PostGIS alone)",
            registry=registry,
        )
        for what in FAILURES:
            self.failures.labels(what)

    def applied(self, store: str, first: int, last: int, seconds: float) -> None:
        self.sequence.labels(store).set(last)
        self.batches.labels(store).inc()
        self.diffs.labels(store).inc(last - first + 1)
        self.seconds.labels(store).observe(seconds)
