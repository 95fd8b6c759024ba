"""The replication follower: applies each new diff of a replication source, in order, to the stores.

The source is a local replication directory or a replication server over HTTP(S) (``source``). Each
round reads ``state.txt``, then, while a store is behind, takes the next diffs (up to ``batch`` of them),
merges them into one file (``batch.py``: sequence order, the highest version of each object) and applies
that to every store at the lowest sequence: the embedded store through the Spark bridge (which expires
the tiles, updates the rendering store and commits the geometry store with the sequence) and, with
``postgis``, a PostGIS store through ``osm2pgsql --append`` (``sinks.py``). A PostGIS store may also be
followed alone (no ``store``): its expiry is then osm2pgsql's own, published on the bus
(``postgis_expiry.py``). Each store's own record is the
one record of its progress: after a restart the follower continues from whatever the stores say, so no
diff is skipped or applied twice (and the bridge refuses a diff that does not follow the store's
sequence). A batch never spans a store's sequence, so a store behind the others catches up first.

In a local directory, a missing diff (a gap) or one that cannot be read stops the follower with a clear
error, before any store saw any of it. A source, bridge or bus that does not answer, an osm2pgsql run that
fails (``StoreUnavailable``), or a server's answer that cannot be followed (``BadAnswer``: a malformed
state file, an unreadable diff, a gap; one bad answer must not end a daemon that the server's next answer
may set right) is not an error: the stores' sequences stay where they were, and the follower backs off
(``interval`` doubled per failure, at most ``max_backoff``), logs it, counts it (``metrics.py``), and tries
again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import structlog

from qbroker import QBrokerError, Unit
from qbroker.metrics_port import MetricsServer
from services.osmstore.errors import StoreUnavailable
from services.osmstore.postgis import ExpireOutput, stop_running
from services.osmstore.replication import ReplicationError
from services.toposm.metrics_port import service_metrics
from services.toposm.tilemath import ZoomRange

from .batch import Batch, build_batch, clear_spool
from .metrics import NAMESPACE, ReplicateMetrics
from .postgis_expiry import PostgisExpiry
from .sinks import BridgeCall, EmbeddedStore, PostgisStore, Sink
from .source import DOWNLOAD_DEADLINE, SourceUnavailable, is_url, open_source

log = structlog.get_logger("toposm.replicate")
T = TypeVar("T")

STATUS_FILE = "replication.json"
SPOOL_DIR = "replication-spool"  # under the store unless --spool says otherwise
# What --once's error and the log say of a round that failed, by its metrics.FAILURES label.
_FAILED = {
    "source": ("the source did not answer", "source unavailable"),
    "answer": ("the source answered badly", "source answered badly"),
    "bridge": ("the bridge did not answer", "bridge unavailable"),
    "bus": ("the bus did not answer", "bus unavailable"),
    "postgis": ("the postgis failed", "postgis unavailable"),
}


@dataclass(frozen=True)
class FollowSettings:
    source: Path | str  # a replication directory, or an http(s):// URL of one
    store: Path | None  # the embedded store; None: the PostGIS store alone (``postgis`` and ``spool`` given)
    store_name: str
    start: int | None = None  # the first sequence to apply when a store has none yet
    interval: float = 60.0  # seconds between looks at state.txt
    once: bool = False  # apply what is published, then stop
    min_zoom: int = 10
    max_zoom: int = 18
    call_timeout: float = 3600.0
    batch: int = 10  # diffs merged into one job at most when behind
    max_backoff: float = 900.0  # the longest wait after repeated failures
    spool: Path | None = None  # merged diffs for the bridge (under its --input-root); default STORE/replication-spool
    http_timeout: float = 60.0  # seconds to connect and for each read
    http_deadline: float = DOWNLOAD_DEADLINE  # seconds for one download in all
    http_retries: int = 3  # per request (5xx, 429, refused, cut short), before the follower backs off
    postgis: str | None = None  # a PostGIS DSN kept current too (osm2pgsql --append)
    flat_nodes: Path | None = None  # the flat-nodes file the PostGIS import used
    expire_output: Path | None = None  # osm2pgsql's expired tiles (min_zoom..max_zoom) appended here

    def __post_init__(self) -> None:
        if self.store is None and (self.postgis is None or self.spool is None):
            raise ValueError("without an embedded store, the PostGIS DSN and a spool directory are needed")

    @property
    def spool_dir(self) -> Path:
        if self.spool is not None:
            return self.spool
        assert self.store is not None  # __post_init__
        return self.store / SPOOL_DIR

    @property
    def status_dir(self) -> Path:
        """Where replication.json goes: the embedded store, else the spool."""
        return self.store if self.store is not None else self.spool_dir


class BadAnswer(ReplicationError):
    """A replication server answered something that cannot be followed (the message says what): the follower
    backs off, as from a server that does not answer; from a directory the same error stops it."""


def backoff(failures: int, interval: float, ceiling: float) -> float:
    """Seconds to wait after ``failures`` failures in a row: interval, 2x, 4x ... at most ``ceiling``."""
    return float(min(ceiling, interval * 2 ** min(max(failures - 1, 0), 32)))


class Follower:
    """A ``qbroker.runner.Service``: ``start`` launches the follow loop, ``stop`` ends it."""

    def __init__(self, unit: Unit, settings: FollowSettings, metrics: MetricsServer | None = None) -> None:
        self.unit = unit
        self.settings = settings
        # Not served without --metrics-port; the counters are kept either way (tests read them).
        self.metrics_server = metrics or service_metrics(NAMESPACE, None)
        self.metrics_server.instrument(unit)
        self.metrics = ReplicateMetrics(self.metrics_server.registry)
        self.source = open_source(
            settings.source,
            timeout=settings.http_timeout,
            deadline=settings.http_deadline,
            retries=settings.http_retries,
        )
        self.embedded: EmbeddedStore | None = None
        self.sinks: list[Sink] = []
        if settings.store is not None:
            self.embedded = EmbeddedStore(
                unit,
                settings.store,
                BridgeCall(settings.store_name, settings.min_zoom, settings.max_zoom, settings.call_timeout),
            )
            self.sinks.append(self.embedded)
        if settings.postgis is not None:
            expire = (
                ExpireOutput(settings.min_zoom, settings.max_zoom, settings.expire_output)
                if settings.expire_output is not None
                else None
            )
            # Alone, nothing else expires tiles: osm2pgsql's own expiry goes on the bus.
            publish = (
                PostgisExpiry(
                    unit,
                    settings.spool_dir,
                    ZoomRange(settings.min_zoom, settings.max_zoom),
                    copy_to=settings.expire_output,
                )
                if self.embedded is None
                else None
            )
            self.sinks.append(
                PostgisStore(
                    settings.postgis,
                    str(settings.source),
                    flat_nodes=settings.flat_nodes,
                    expire=expire,
                    publish=publish,
                )
            )
        self.error: str | None = None
        self.applied: list[int] = []
        self.jobs: list[tuple[int, int]] = []  # (first, last) of each batch applied
        self.failures = 0  # in a row; reset by a successful round
        self.retries = 0  # rounds that failed and were retried, in all
        self.finished = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        self.metrics_server.start()
        self._task = asyncio.create_task(self._run(), name="toposm-replicate")

    async def stop(self) -> None:
        """Within the unit's drain timeout: the round in progress may finish in the first half; then its
        osm2pgsql or psql is ended (those diffs are applied again at the next start, as after a kill) and
        what is left (a download, a bridge call) cancelled."""
        self._stopping.set()
        task = self._task
        if task is not None:
            drain = self.unit.config.drain_timeout
            done, _ = await asyncio.wait({task}, timeout=drain / 2)
            if not done and stop_running():
                log.warning("stopping: osm2pgsql or psql ended; those diffs are applied again at the next start")
                done, _ = await asyncio.wait({task}, timeout=drain / 4)
            while not done:  # ended again: one may have started between the look and the signal
                stop_running()
                task.cancel()
                done, _ = await asyncio.wait({task}, timeout=0.2)
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.metrics_server.stop()

    async def _run(self) -> None:
        s = self.settings
        try:
            await asyncio.to_thread(clear_spool, s.spool_dir)
            while not self._stopping.is_set():
                delay = s.interval
                try:
                    await self.catch_up()
                    self.failures = 0
                except (QBrokerError, TimeoutError, SourceUnavailable, StoreUnavailable, BadAnswer) as exc:
                    what = self._what_failed(exc)
                    error, event = _FAILED[what]
                    if s.once:
                        raise ReplicationError(f"{error}: {exc}") from None
                    self.failures += 1
                    self.retries += 1
                    self.metrics.failures.labels(what).inc()
                    delay = backoff(self.failures, s.interval, s.max_backoff)
                    log.warning(
                        f"{event}; backing off", error=str(exc)[:300], failures=self.failures, retry_in=round(delay, 2)
                    )
                self.metrics.failing.set(self.failures)
                if s.once:
                    break
                try:
                    await asyncio.wait_for(self._stopping.wait(), delay)
                except TimeoutError:
                    pass
        except ReplicationError as exc:
            self.error = str(exc)
            log.error("replication stopped", error=self.error)
        finally:
            await self.source.close()
            self.finished.set()

    def _what_failed(self, exc: BaseException) -> str:
        """The ``failures`` label (metrics.FAILURES) and the log's word for a round that failed."""
        if isinstance(exc, SourceUnavailable):
            return "source"
        if isinstance(exc, BadAnswer):
            return "answer"
        if isinstance(exc, StoreUnavailable):
            return "postgis"
        return "bridge" if self.embedded is not None else "bus"

    def _position(self, sink: Sink) -> int:
        position = sink.position()
        if position is not None:
            return position
        if self.settings.start is None:
            where = self.settings.store if sink is self.embedded else "the PostGIS store"
            raise ReplicationError(
                f"{where}: the store has no replication sequence yet; pass --start N (the first diff to apply)"
            )
        return self.settings.start - 1

    async def catch_up(self) -> list[int]:
        """Apply every published diff after the stores' sequences, in order; returns the sequences applied."""
        s = self.settings
        published = (await self._from_source(self.source.latest())).sequence
        done: list[int] = []
        while not self._stopping.is_set():
            positions = [await asyncio.to_thread(self._position, sink) for sink in self.sinks]
            low = min(positions)
            if low >= published:
                break
            last = min(published, low + s.batch)
            # Never across a store's sequence (nor the rendering store's, ahead after a crash): each store
            # gets exactly the diffs after its own.
            rendering = await asyncio.to_thread(self.embedded.render_position) if self.embedded else None
            for bound in [*positions, rendering]:
                if bound is not None and low < bound < last:
                    last = bound
            batch = await self._from_source(build_batch(self.source, low + 1, last, s.spool_dir, published=published))
            try:
                await self._apply(batch, [sink for sink, at in zip(self.sinks, positions, strict=True) if at == low])
            finally:
                batch.discard()
            done.extend(batch.sequences)
        return done

    async def _from_source(self, reading: Awaitable[T]) -> T:
        """What the source gave; from a server, an answer that cannot be followed is a ``BadAnswer``."""
        try:
            return await reading
        except ReplicationError as exc:
            if self.source.remote:
                raise BadAnswer(str(exc)) from None
            raise

    async def _apply(self, batch: Batch, sinks: list[Sink]) -> None:
        bound = log.bind(correlation_id=uuid.uuid4().hex[:12], first=batch.first, last=batch.last)
        started = time.monotonic()
        results: dict[str, dict[str, Any]] = {}
        for sink in sinks:
            at = time.monotonic()
            results[sink.name] = await sink.apply(batch)
            self.metrics.applied(sink.name, batch.first, batch.last, time.monotonic() - at)
        self.applied.extend(batch.sequences)
        self.jobs.append((batch.first, batch.last))
        result = results.get(EmbeddedStore.name, {})
        expired = results.get(PostgisStore.name, {}).get("expired")  # osm2pgsql's, published (PostGIS alone)
        if expired is not None:
            self.metrics.expired.inc(expired["metatiles"])
            result = {"total_metatiles": expired["metatiles"], "expired": expired}
        await asyncio.to_thread(self._write_status, batch, result, sorted(results))
        bound.info(
            "diffs applied",
            stores=sorted(results),
            timestamp=batch.timestamp,
            replay=(result.get("store") or {}).get("replay"),
            metatiles=result.get("total_metatiles"),
            seconds=round(time.monotonic() - started, 2),
        )

    def _write_status(self, batch: Batch, result: dict[str, Any], stores: list[str]) -> None:
        """For operators: what was applied last (each store's own record stays the record of progress)."""
        source = self.settings.source
        status = {
            "source": source if is_url(source) else str(source),
            "sequence": batch.last,
            "first_sequence": batch.first,
            "timestamp": batch.timestamp,
            "stores": stores,
            "applied_at": time.time(),
            "metatiles": result.get("total_metatiles"),
            "inputs": result.get("inputs"),
        }
        path = self.settings.status_dir / STATUS_FILE
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(status, indent=2) + "\n")
        tmp.replace(path)
