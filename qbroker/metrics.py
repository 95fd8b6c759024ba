"""Opt-in Prometheus metrics for a unit: what it handles, what it sends, its connection, its dead letters.

``instrument(unit)`` adds one middleware (``Unit.use``, see qbroker.middleware): its ``handle`` link counts
every request and alert the unit handles (status, duration, error id, running now), its ``send`` hook every
call, cast, alert and gather the unit sends (outcome, call latency, error id, waiting now). It also hooks
``unit.on_connected`` (connections up, reconnects) and the observers of the unit's dead-letter collector
(dead requests answered). A unit that is not instrumented carries none of it: no link in its chains and
no send hook around its calls. The core does not import prometheus-client (``pip install 'qbroker-amqp[metrics]'``).
A unit with an HTTP server of its own renders ``generate_latest(registry)``; any other can call ``serve``,
and a program with a ``--metrics-port`` uses qbroker.metrics_port (``program_registry`` below: its build info,
no ``_created`` series).

Every label set is bounded. Names come from the wire (a forged alert, a per-job ``spark.progress.<id>``):
past ``max_names`` distinct names per family (handled, sent), further ones count under ``other``. Error
ids count as themselves when the program defines them (``qbroker.errors.is_known_error_id``, or given in
``error_ids``), anything a peer made up as ``other``; dead-letter reasons likewise (the broker's and
qbroker's own). A name that carries a process's identity (a per-process endpoint) takes the label
``endpoint_label`` gives it, so a restarted process continues its series. The metric names and labels are
listed in docs/metrics.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIServer

try:
    from prometheus_client import CollectorRegistry, Gauge, disable_created_metrics, start_http_server
except ModuleNotFoundError as exc:  # say what to install, not just which module is missing
    raise ModuleNotFoundError(
        f"qbroker.metrics needs prometheus-client: pip install 'qbroker-amqp[metrics]' ({exc})", name=exc.name
    ) from exc
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from qbroker.context import RequestContext
from qbroker.errors import ErrorInfo, QBrokerError, is_known_error_id
from qbroker.metric_families import OTHER, Counts, NameLabels, Timings
from qbroker.middleware import Middleware, Next, Outcome, Sending

if TYPE_CHECKING:
    from qbroker.dead_letter import DeadLetterCollector
    from qbroker.transport import Connection
    from qbroker.unit import Unit

DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Why the dead-letter collector got a request: the broker's x-death reasons and qbroker's own (dead_letter.classify).
DEAD_LETTER_REASONS = (
    "unroutable",
    "expired",
    "rejected",
    "maxlen",
    "delivery_limit",
    "poison",
    "retries_exhausted",
    "unknown",
)
DEAD_LETTER_KINDS = ("rpc", "alert", "reply", "unknown")  # dead_letter.classify's
HANDLED_KINDS = ("rpc", "alert")
WAITING_KINDS = ("call", "gather")  # sends that wait for replies


class UnitMetrics(Collector):
    """The library's own metrics for one or more units (of one event loop), on one registry."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        max_names: int = 200,
        error_ids: Iterable[str] = (),
        endpoint_label: Callable[[str], str] | None = None,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.max_names = max_names
        self._handled_names = NameLabels(max_names, endpoint_label)
        self._sent_names = NameLabels(max_names, endpoint_label)
        self._handled_labels, self._sent_labels = self._handled_names.known, self._sent_names.known
        self._dead_letter_collectors: list[DeadLetterCollector] = []
        self._error_ids = set(error_ids)
        self.handled = Counts(
            "qbroker_handled",
            "Requests and alerts handled, by endpoint (or alert name), kind and status",
            ["endpoint", "kind", "status"],
        )
        self.handler_errors = Counts(
            "qbroker_handler_errors", "Handled messages whose status was error or fail", ["endpoint", "kind", "status"]
        )
        self.duration = Timings(
            "qbroker_handler_duration_seconds",
            "Time to answer requests and alerts (built-in links and handler), by endpoint and kind",
            ["endpoint", "kind"],
            DURATION_BUCKETS,
        )
        self.handlers_running = Counts(
            "qbroker_handlers_in_flight", "Requests and alerts being handled now, by kind", ["kind"], "gauge"
        )
        self.sent = Counts(
            "qbroker_calls",
            "Calls, casts, alerts and gathers this unit sent, by name, kind and outcome status",
            ["endpoint", "kind", "status"],
        )
        self.call_duration = Timings(
            "qbroker_call_duration_seconds",
            "Calls from first send to reply or error (retries included), by name",
            ["endpoint"],
            DURATION_BUCKETS,
        )
        self.calls_waiting = Counts(
            "qbroker_calls_in_flight", "Calls and gathers waiting for replies now, by kind", ["kind"], "gauge"
        )
        self.errors = Counts(
            "qbroker_errors",
            "Errors by error id: side caller (what a call, cast, alert or gather "
            "ended with), side handler (what a request or alert was answered with)",
            ["side", "error_id"],
        )
        self.connections = Counts("qbroker_connections", "Broker connections up (one per connected unit)", [], "gauge")
        self.reconnects = Counts("qbroker_reconnects", "Broker connections re-established after a loss", [])
        self.dead_letters_answered = Counts(
            "qbroker_dead_letters_answered",
            "Dead requests this unit's dead-letter collector answered, by reason",
            ["reason"],
        )
        for kind in HANDLED_KINDS:  # the gauges are there (at 0) before anything happened
            self.handlers_running.inc((kind,), 0)
        for kind in WAITING_KINDS:
            self.calls_waiting.inc((kind,), 0)
        self.connections.inc((), 0)
        self.reconnects.inc((), 0)
        self._families = (
            self.handled,
            self.handler_errors,
            self.duration,
            self.handlers_running,
            self.sent,
            self.call_duration,
            self.calls_waiting,
            self.errors,
            self.connections,
            self.reconnects,
            self.dead_letters_answered,
        )
        self.registry.register(self)

    def describe(self) -> Iterable[Metric]:
        return [*(family.family(empty=True) for family in self._families), self._dead_letters(empty=True)]

    def collect(self) -> Iterable[Metric]:
        return [*(family.family() for family in self._families), self._dead_letters()]

    def count_dead_letters_of(self, collector: DeadLetterCollector) -> None:
        self._dead_letter_collectors.append(collector)

    def _dead_letters(self, empty: bool = False) -> Metric:
        """Every dead message the instrumented units' collectors took, read from their own counts (a copy
        each, taken at once); kinds and reasons they do not define (a forged ``x-death``) as ``other``."""
        family = CounterMetricFamily(
            "qbroker_dead_letters",
            "Dead messages this unit's dead-letter collector took, by kind and reason",
            labels=["kind", "reason"],
        )
        totals: dict[tuple[str, str], float] = {}
        for collector in [] if empty else self._dead_letter_collectors:
            for key, count in list(collector.counts.items()):
                kind, _, reason = key.partition(".")
                labels = (
                    kind if kind in DEAD_LETTER_KINDS else OTHER,
                    reason if reason in DEAD_LETTER_REASONS else OTHER,
                )
                totals[labels] = totals.get(labels, 0.0) + count
        for labels, total in totals.items():
            family.add_metric(labels, total)
        return family

    def error_label(self, error_id: str) -> str:
        if error_id in self._error_ids:
            return error_id
        if is_known_error_id(error_id):  # defined by this program: bounded, so remembered
            self._error_ids.add(error_id)
            return error_id
        return OTHER

    def observe(self, endpoint: str, kind: str, status: str, seconds: float, error_id: str | None = None) -> None:
        """One request or alert handled (also a ``HandlerObserver``: ``unit.handler_observers.append``).
        Once per request: the updates are written out, not calls of ``Counts.inc``."""
        try:
            name = self._handled_labels[endpoint]  # the usual case: a dict subscript, cheaper than .get
        except KeyError:
            name = self._handled_names(endpoint)
        key = (name, kind, status)
        handled = self.handled.values
        handled[key] = handled.get(key, 0.0) + 1
        if status in ("error", "fail"):
            self.handler_errors.inc(key)
        if error_id is not None:
            self.errors.inc(("handler", self.error_label(error_id)))
        self.duration.observe((name, kind), seconds)

    def observe_refused(self, endpoint: str, kind: str, error: ErrorInfo) -> None:
        """A request or alert refused before any handler chain (unreadable, too large): counted as handled
        with its status (``fail``) and error id, with no duration (no link ran)."""
        key = (self._handled_names(endpoint), kind, error.status)
        self.handled.inc(key)
        if error.status in ("error", "fail"):
            self.handler_errors.inc(key)
        self.errors.inc(("handler", self.error_label(error.id)))

    def observe_sent(self, sending: Sending, exc: BaseException | None, seconds: float) -> None:
        """One call, cast, alert or gather done with: answered, sent, ended, or failed with ``exc``."""
        error_id: str | None = None
        if exc is None or isinstance(exc, GeneratorExit):  # GeneratorExit: a gather its caller left early
            status = "ok" if sending.reply is None else sending.reply.status
        elif isinstance(exc, QBrokerError):
            status, error_id = exc.status, exc.id
        elif isinstance(exc, asyncio.CancelledError):
            status = "cancelled"
        else:
            status, error_id = "error", OTHER
        kind = sending.kind
        try:
            name = self._sent_labels[sending.name]
        except KeyError:
            name = self._sent_names(sending.name)
        key = (name, kind, status)
        sent = self.sent.values
        sent[key] = sent.get(key, 0.0) + 1
        if kind == "call":
            self.call_duration.observe((name,), seconds)
        if error_id is not None:
            self.errors.inc(("caller", self.error_label(error_id)))

    def observe_dead_letter(self, reason: str, error: QBrokerError) -> None:
        self.dead_letters_answered.inc((reason if reason in DEAD_LETTER_REASONS else OTHER,))

    def connected(self, connection: Connection) -> None:
        """A unit's connection is up: counted until it closes."""
        self.connections.inc(())
        connection.close_callbacks.add(self._connection_closed)

    def _connection_closed(self, *_: object) -> None:
        self.connections.inc((), -1)


class MetricsMiddleware(Middleware):
    """``UnitMetrics`` as a middleware: outermost but for those added before it, so a request the built-ins
    refuse (``deadline_passed``, ``poison_request``) counts too, and through ``refused`` one refused before
    any chain (unreadable, too large). A request handed on (re-published for a retry or with its redelivery
    count) counts as ``handed_on``; its copy counts when handled."""

    def __init__(self, metrics: UnitMetrics) -> None:
        self.metrics = metrics

    async def handle(self, call_next: Next, ctx: RequestContext, body: Any) -> Outcome:
        running, key = self.metrics.handlers_running.values, (ctx.kind,)
        running[key] = running.get(key, 0.0) + 1
        started = time.perf_counter()
        try:
            result, error = await call_next(ctx, body)
        except QBrokerError as exc:  # a link refused by raising: the request is answered with it
            running[key] -= 1
            self._observe(ctx, exc.to_info(), started)
            raise
        except BaseException:  # cancelled (a killed unit): nobody is answered, nothing to count
            running[key] -= 1
            raise
        running[key] -= 1
        self._observe(ctx, error, started)
        return result, error

    def _observe(self, ctx: RequestContext, error: ErrorInfo | None, started: float) -> None:
        seconds = time.perf_counter() - started
        if error is None:
            status, failed = "ok", None
        else:
            status = error.status
            failed = error.id if status in ("error", "fail") else None
        self.metrics.observe(
            ctx.part or ctx.header.name or "", ctx.kind, "handed_on" if ctx.handed_on else status, seconds, failed
        )

    def refused(self, name: str, kind: str, error: ErrorInfo) -> None:
        self.metrics.observe_refused(name, kind, error)

    def send(self, sending: Sending) -> contextlib.AbstractContextManager[None]:
        return _Sent(self.metrics, sending)


class _Sent(contextlib.AbstractContextManager[None]):
    """One sent message while the unit waits for it (a call: until answered; a gather: until it ends)."""

    __slots__ = ("metrics", "sending", "waits", "started")

    def __init__(self, metrics: UnitMetrics, sending: Sending) -> None:
        self.metrics = metrics
        self.sending = sending
        # the gauge's key for a call or gather (set at 0 from the start), None for what nobody waits for
        self.waits = (sending.kind,) if sending.kind in WAITING_KINDS else None

    def __enter__(self) -> None:
        if self.waits:
            waiting = self.metrics.calls_waiting.values
            waiting[self.waits] += 1
        self.started = time.perf_counter()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        seconds = time.perf_counter() - self.started
        if self.waits:
            self.metrics.calls_waiting.values[self.waits] -= 1
        self.metrics.observe_sent(self.sending, exc, seconds)


def instrument(unit: Unit, metrics: UnitMetrics | None = None) -> UnitMetrics:
    """Count what this unit handles and sends, its reconnects and dead letters on ``metrics`` (a new registry
    when not given). Call it before ``unit.start()`` (later, the connection already up counts too)."""
    metrics = metrics or UnitMetrics()
    unit.use(MetricsMiddleware(metrics))
    connected_before = unit.state != "new"
    if unit.connection is not None and not unit.connection.is_closed:
        metrics.connected(unit.connection)

    async def connected(connection: Connection) -> None:
        nonlocal connected_before
        if connected_before:
            metrics.reconnects.inc(())
        connected_before = True
        metrics.connected(connection)

    unit.on_connected(connected)
    if unit.dead_letters is not None:
        unit.dead_letters.observers.append(metrics.observe_dead_letter)
        metrics.count_dead_letters_of(unit.dead_letters)
    return metrics


def program_registry(namespace: str, version: str) -> CollectorRegistry:
    """A program's registry (docs/metrics.md): ``<namespace>_build_info{version="..."} 1`` in it, and no
    ``_created`` series in the process: prometheus-client would add one per counter and histogram, a second
    series apiece that holds only the process's start time."""
    disable_created_metrics()
    registry = CollectorRegistry()
    Gauge(f"{namespace}_build_info", "The version this program runs (always 1)", ["version"], registry=registry).labels(
        version
    ).set(1)
    return registry


def serve(metrics: UnitMetrics, port: int, addr: str = "127.0.0.1") -> WSGIServer:
    """Expose ``metrics`` on ``http://addr:port/metrics`` from a background thread (units without HTTP);
    port 0 takes a free one (``server.server_address[1]``), ``server.shutdown()`` stops it."""
    server, _ = start_http_server(port, addr=addr, registry=metrics.registry)
    return server
