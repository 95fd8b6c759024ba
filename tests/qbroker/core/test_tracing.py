"""OpenTelemetry tracing middleware on real RabbitMQ: spans per call, handled request, alert and gather,
linked across units by the W3C ``traceparent`` header, and tolerant of messages that carry none."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from harness import eventually
from qbroker import RequestError, Unit
from qbroker.middleware import Middleware, Sending
from qbroker.tracing import Tracing
from tests.conftest import MakeUnit

pytestmark = pytest.mark.rabbitmq_only


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def named(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = [span for span in exporter.get_finished_spans() if span.name == name]
    assert len(found) == 1, [span.name for span in exporter.get_finished_spans()]
    return found[0]


def is_parent(parent: ReadableSpan, child: ReadableSpan) -> bool:
    assert child.parent is not None, f"{child.name} has no parent"
    return child.parent.span_id == parent.context.span_id and child.context.trace_id == parent.context.trace_id


async def test_one_trace_across_three_units(make_unit: MakeUnit, transport: str, spans) -> None:
    provider, exporter = spans
    front, back, client = [await make_unit(f"test.trace.{n}") for n in ("front", "back", "client")]

    @back.rpc("trace.back")
    async def deep(n: int) -> int:
        return n * 2

    @front.rpc("trace.front")
    async def outer(n: int) -> int:
        return await front.call("trace.back", {"n": n}) + 1

    @back.rpc("trace.broken")
    async def broken() -> None:
        raise RequestError("disk_full", "no space left")

    for unit in (front, back, client):
        unit.use(Tracing(provider))
        await unit.start()
    assert await client.call("trace.front", {"n": 20}) == 41
    with contextlib.suppress(RequestError):
        await client.call("trace.broken", {})

    await eventually(lambda: len(exporter.get_finished_spans()) >= 6)
    call_front, handle_front = named(exporter, "call trace.front"), named(exporter, "handle trace.front")
    call_back, handle_back = named(exporter, "call trace.back"), named(exporter, "handle trace.back")
    assert call_front.parent is None and call_front.kind == SpanKind.CLIENT
    assert handle_front.kind == SpanKind.SERVER
    assert is_parent(call_front, handle_front)
    assert is_parent(handle_front, call_back)  # the handler's span is current while it calls on
    assert is_parent(call_back, handle_back)
    assert handle_back.attributes["messaging.rabbitmq.destination.routing_key"] == "trace.back"
    # The error status is on both sides of the failed call.
    assert named(exporter, "handle trace.broken").status.status_code == StatusCode.ERROR
    assert named(exporter, "call trace.broken").status.status_code == StatusCode.ERROR


async def test_alert_and_gather_spans_link_to_their_listeners(make_unit: MakeUnit, transport: str, spans) -> None:
    provider, exporter = spans
    listener, sender = await make_unit("test.trace.listener"), await make_unit("test.trace.sender")

    @listener.on_alert("trace.news")
    async def news() -> None:
        return None

    @listener.on_alert("trace.census")
    async def census() -> str:
        return "here"

    for unit in (listener, sender):
        unit.use(Tracing(provider))
        await unit.start()
    await sender.alert("trace.news", {})
    replies = [reply.body async for reply in sender.gather("trace.census", {}, max_replies=1)]
    assert replies == ["here"]

    await eventually(lambda: len(exporter.get_finished_spans()) >= 4)
    alert, listen = named(exporter, "alert trace.news"), named(exporter, "listen trace.news")
    assert alert.kind == SpanKind.PRODUCER and listen.kind == SpanKind.CONSUMER
    assert is_parent(alert, listen)
    assert is_parent(named(exporter, "gather trace.census"), named(exporter, "listen trace.census"))


class ForgedTraceparent(Middleware):
    """A sender whose traceparent is garbage (a hostile or broken client)."""

    def send(self, sending: Sending) -> contextlib.AbstractContextManager[None]:
        sending.headers["traceparent"] = "00-not-a-trace-01"
        return contextlib.nullcontext()


async def test_a_request_without_or_with_a_bad_traceparent_starts_a_trace(
    make_unit: MakeUnit, transport: str, spans
) -> None:
    provider, exporter = spans
    server: Unit = await make_unit("test.trace.server")
    plain, forged = await make_unit("test.trace.plain"), await make_unit("test.trace.forged")

    @server.rpc("trace.echo")
    async def echo(text: str) -> str:
        return text

    server.use(Tracing(provider))
    forged.use(ForgedTraceparent())
    for unit in (server, plain, forged):
        await unit.start()
    assert await plain.call("trace.echo", {"text": "no header"}) == "no header"  # as a seed client sends
    assert await forged.call("trace.echo", {"text": "bad header"}) == "bad header"

    await eventually(lambda: len(exporter.get_finished_spans()) >= 2)
    handled = [span for span in exporter.get_finished_spans() if span.name == "handle trace.echo"]
    assert len(handled) == 2
    assert all(span.parent is None for span in handled)  # each a root of its own trace
    assert handled[0].context.trace_id != handled[1].context.trace_id
