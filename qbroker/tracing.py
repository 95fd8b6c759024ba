"""OpenTelemetry tracing as a middleware (``pip install 'qbroker-amqp[otel]'``): a span per call, cast, alert and
gather this unit sends, and per request and alert it handles, linked across services by a W3C
``traceparent`` in the AMQP headers.

``unit.use(Tracing())`` (or ``QBROKER_OTEL=1`` for every unit of a process) records spans on the global
tracer provider, or on ``tracer_provider``; where they go (an OTLP collector, the console) is the SDK's
configuration, see docs/library.md. A message without ``traceparent`` (another client of the protocol, an older qbroker)
starts a new trace; an unreadable one is ignored the same way, as the W3C propagator does.

The spans follow OpenTelemetry's messaging conventions: ``call <name>`` (kind CLIENT) on the caller,
``handle <name>`` (SERVER) on the server, ``alert``/``cast``/``gather <name>`` (PRODUCER) on the sender,
``listen <name>`` (CONSUMER) on each listener. A handler's span is the current one while it runs, so the
calls it makes are its children: one ``qbroker call`` shows every service it went through as one trace.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.propagators.textmap import Getter, TextMapPropagator
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ModuleNotFoundError as exc:  # say what to install, not just which module is missing
    raise ModuleNotFoundError(
        f"qbroker.tracing (QBROKER_OTEL=1) needs OpenTelemetry: pip install 'qbroker-amqp[otel]' ({exc})", name=exc.name
    ) from exc

from qbroker.context import RequestContext
from qbroker.errors import ErrorInfo
from qbroker.middleware import Middleware, Next, Outcome, Sending

_SEND_KIND = {
    "call": SpanKind.CLIENT,
    "cast": SpanKind.PRODUCER,
    "alert": SpanKind.PRODUCER,
    "gather": SpanKind.PRODUCER,
}
_EXCHANGE = {"call": "rpc", "cast": "rpc", "alert": "alert", "gather": "alert"}


class _AmqpHeaders(Getter[Any]):
    """Reads a W3C header from an AMQP table, whose strings may arrive as bytes; anything else is absent."""

    def get(self, carrier: Any, key: str) -> list[str] | None:
        value = carrier.get(key)
        if isinstance(value, bytes):
            value = value.decode("ascii", "replace")
        return [value] if isinstance(value, str) else None

    def keys(self, carrier: Any) -> list[str]:
        return [key for key in carrier if isinstance(key, str)]


_GETTER = _AmqpHeaders()


def _mark(span: trace.Span, error: ErrorInfo | None) -> None:
    if error is None:
        return
    span.set_attribute("qbroker.status", error.status)
    if error.id:
        span.set_attribute("error.type", error.id)
    if error.status in ("error", "fail"):
        span.set_status(Status(StatusCode.ERROR, error.message))


class Tracing(Middleware):
    """The OpenTelemetry middleware; add it outermost (the default) so its spans cover the built-ins."""

    def __init__(
        self, tracer_provider: trace.TracerProvider | None = None, propagator: TextMapPropagator | None = None
    ) -> None:
        self.tracer = trace.get_tracer("qbroker", tracer_provider=tracer_provider)
        self.propagator = propagator or TraceContextTextMapPropagator()

    async def handle(self, call_next: Next, ctx: RequestContext, body: Any) -> Outcome:
        headers = ctx.message.headers if ctx.message is not None else None
        parent = self.propagator.extract(headers or {}, getter=_GETTER)
        rpc = ctx.kind == "rpc"
        part = ctx.part or ctx.name or ""
        attributes = {
            "messaging.system": "rabbitmq",
            "messaging.operation.type": "process",
            "messaging.destination.name": "rpc" if rpc else "alert",
            "messaging.rabbitmq.destination.routing_key": part,
            "messaging.message.id": ctx.message_id or "",
            "qbroker.app_id": ctx.app_id or "",
        }
        with self.tracer.start_as_current_span(
            f"{'handle' if rpc else 'listen'} {part}",
            context=parent,
            kind=SpanKind.SERVER if rpc else SpanKind.CONSUMER,
            attributes=attributes,
        ) as span:
            result, error = await call_next(ctx, body)
            _mark(span, error)
            return result, error

    def send(self, sending: Sending) -> contextlib.AbstractContextManager[None]:
        return self._sending(sending)

    @contextlib.contextmanager
    def _sending(self, sending: Sending) -> Iterator[None]:
        # Not made current: a gather's span stays open while its caller iterates, and nothing the
        # caller does meanwhile is part of it. The message carries it as the parent of its handling.
        span = self.tracer.start_span(
            f"{sending.kind} {sending.name}",
            kind=_SEND_KIND[sending.kind],
            attributes={
                "messaging.system": "rabbitmq",
                "messaging.operation.type": "send",
                "messaging.destination.name": _EXCHANGE[sending.kind],
                "messaging.rabbitmq.destination.routing_key": sending.name,
            },
        )
        try:
            self.propagator.inject(sending.headers, context=trace.set_span_in_context(span))
            yield
            error = getattr(sending.reply, "error", None)
            _mark(span, error if isinstance(error, ErrorInfo) else None)
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            span.end()
